# Helpers the bench and test scripts share; `source "$(dirname "$0")/lib.sh"`.

# A free TCP port on 127.0.0.1 (the kernel picks it).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# json FILE EXPR: EXPR evaluated in Python with the file's JSON as `r`.
json() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# trace_unique_blocks FILE: distinct hash_ids in a Mooncake JSONL trace.
trace_unique_blocks() {
  python3 -c "
import json, sys
ids = set()
for line in open(sys.argv[1]):
    if line.strip():
        ids.update(json.loads(line)['hash_ids'])
print(len(ids))" "$1"
}
