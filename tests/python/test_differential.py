"""Differential tests: the same commands go to kvtier and to a real
redis-server 7.0, and the replies must be the same bytes, error texts
included.

Replies are read raw (see resp.py), so nothing is normalised. Where an answer
depends on the clock, it is compared within a tolerance; where it is
unordered (KEYS, SCAN), as a set; where it is random (RANDOMKEY), not at all.

Intended differences (kvtier has only db 0, only strings, reports Redis 7.2.4
and has no persistence) are not compared here; each is pinned down in
``test_intended_differences`` instead.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import socket
import time
from typing import Any, Callable

import pytest
import redis

from resp import ErrorReply, RawConnection, encode, parse


class Differ:
    """Sends each command to both servers and compares the replies."""

    def __init__(self, ref: RawConnection, kv: RawConnection):
        self.ref = ref
        self.kv = kv

    def both(self, *cmd: Any) -> tuple[bytes, bytes]:
        return self.ref.call(*cmd), self.kv.call(*cmd)

    def same(self, *cmd: Any) -> Any:
        want, got = self.both(*cmd)
        assert got == want, f"{_show(cmd)}\n  redis:  {want[:500]!r}\n  kvtier: {got[:500]!r}"
        return parse(want)

    def close(self, *cmd: Any, tolerance: int) -> int:
        """Both answer integers within `tolerance` of each other (clock reads)."""
        want, got = (parse(r) for r in self.both(*cmd))
        assert isinstance(want, int) and isinstance(got, int), f"{_show(cmd)}: {want!r} vs {got!r}"
        if want < 0 or got < 0:  # -1 / -2 are exact answers
            assert got == want, f"{_show(cmd)}: redis {want} kvtier {got}"
        assert abs(want - got) <= tolerance, f"{_show(cmd)}: redis {want} kvtier {got}"
        return want

    def same_set(self, *cmd: Any) -> set:
        want, got = (parse(r) for r in self.both(*cmd))
        assert isinstance(want, list) and isinstance(got, list), f"{_show(cmd)}: {want!r} vs {got!r}"
        assert len(got) == len(want), f"{_show(cmd)}: duplicates? {want!r} vs {got!r}"
        assert set(got) == set(want), f"{_show(cmd)}:\n  redis:  {sorted(want)!r}\n  kvtier: {sorted(got)!r}"
        return set(want)

    def scan_all(self, *options: Any) -> set:
        """A whole SCAN on each server; the key sets must match."""
        sets = []
        for conn in (self.ref, self.kv):
            cursor, keys, rounds = b"0", [], 0
            while True:
                reply = parse(conn.call("SCAN", cursor, *options))
                assert isinstance(reply, list) and len(reply) == 2, reply
                cursor, batch = reply
                keys.extend(batch)
                rounds += 1
                assert rounds < 100_000, "SCAN does not terminate"
                if cursor == b"0":
                    break
            sets.append(set(keys))
        assert sets[1] == sets[0], f"SCAN {options}:\n  redis:  {sorted(sets[0])}\n  kvtier: {sorted(sets[1])}"
        return sets[0]

    def run_script(self, text: str) -> None:
        """Runs a script: one command per line, shell-quoted. A line may start
        with a mode: ``~s`` (integer seconds from the clock, +-1), ``~ms``
        (integer milliseconds from the clock, +-1500), ``@set`` (unordered)."""
        for line in text.strip().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            mode = None
            if line.split(" ", 1)[0] in ("~s", "~ms", "@set"):
                mode, line = line.split(" ", 1)
            cmd = shlex.split(line)
            if mode == "~s":
                self.close(*cmd, tolerance=1)
            elif mode == "~ms":
                self.close(*cmd, tolerance=1500)
            elif mode == "@set":
                self.same_set(*cmd)
            else:
                self.same(*cmd)


def _show(cmd: tuple) -> str:
    return " ".join(repr(a) if isinstance(a, bytes) else str(a) for a in cmd)


@pytest.fixture
def d(ref: RawConnection, kv: RawConnection) -> Differ:
    return Differ(ref, kv)


# ---------------------------------------------------------------------------
# Scripted sessions
# ---------------------------------------------------------------------------

SCRIPTS: dict[str, str] = {}

SCRIPTS["set_options"] = """
SET k v
SET k v NX
SET k v XX
SET k v NX XX
SET k v XX NX
SET k v GET
SET k v2 NX GET
SET k v3 XX GET
SET nokey v XX GET
SET nokey v NX GET
GET nokey
SET k v EX 10
~s TTL k
SET k v PX 10000
~ms PTTL k
SET k v EXAT 99999999999
TTL k
EXPIRETIME k
SET k v PXAT 99999999999999
PEXPIRETIME k
SET k v KEEPTTL
PEXPIRETIME k
SET k v
TTL k
set K V ex 100 nx
~s ttl K
SET k v GET GET
SET k v NX NX
SET k v XX XX
SET k v KEEPTTL KEEPTTL
SET k v EX 10 EX 20
~s TTL k
SET k v PX 100 PX 200000
~ms PTTL k
SET k v EX 10 GET EX 20 XX
SET k v GET NX
SET k v GET XX KEEPTTL
~s TTL k
SET k v EX 10 KEEPTTL
SET k v KEEPTTL EX 10
SET k v KEEPTTL PX 10
SET k v EX 10 PX 10
SET k v PX 10 EXAT 10
SET k v EXAT 10 PXAT 10
SET k v EX
SET k v PX
SET k v EX 0
SET k v EX -1
SET k v PX 0
SET k v PXAT 0
SET k v EXAT -5
SET k v EX abc
SET k v EX 1.5
SET k v EX ""
SET k v EX 9223372036854775807
SET k v PX 9223372036854775807
SET k v EXAT 9223372036854775807
SET k v PXAT 9223372036854775807
SET k v EX 9223372036854775
SET k v EX 9223372036854776
SET k v EX 92233720368547758
SET k v EX abc FOO
SET k v EX 10 EX abc
SET k v EX abc EX 10
~s TTL k
SET k v FOO
SET k v PERSIST
SET k v NX FOO
SET k
SET
GET k
SET k v PXAT 1
GET k
EXISTS k
SET k v EXAT 1 GET
SET k v EXAT 1 GET
EXISTS k
SET "" empty-key
GET ""
SET k ""
GET k
STRLEN k
"""

SCRIPTS["setnx_setex_psetex"] = """
SETNX a 1
SETNX a 2
GET a
SETNX a
SETNX a b c
SETEX b 10 v
~s TTL b
SETEX b 0 v
SETEX b -5 v
SETEX b abc v
SETEX b 1.5 v
SETEX b 10
SETEX b 9223372036854775807 v
SETEX b 9223372036854775 v
GET b
PSETEX c 10000 v
~ms PTTL c
PSETEX c 0 v
PSETEX c abc v
PSETEX c -1 v
PSETEX c 9223372036854775807 v
PSETEX c 10 v w
GET c
SETEX e 100 123
OBJECT ENCODING e
"""

SCRIPTS["getex"] = """
SET g v
GETEX g
TTL g
GETEX g EX 100
~s TTL g
GETEX g PX 100000
~ms PTTL g
GETEX g EXAT 99999999999
EXPIRETIME g
GETEX g PXAT 99999999999999
PEXPIRETIME g
GETEX g PERSIST
TTL g
GETEX g PERSIST PERSIST
GETEX g EX 10 EX 20
~s TTL g
GETEX g EX 0
GETEX g EX -1
GETEX g EX abc
GETEX g PX 9223372036854775807
GETEX g EX abc FOO
GETEX g PERSIST EX 10
GETEX g EX 10 PERSIST
GETEX g EX 10 PX 10
GETEX g FOO
GETEX g EX
GETEX g KEEPTTL
GETEX g NX
GETEX g XX
GETEX g GET
GETEX nokey EX 10
GETEX nokey EX abc
GETEX nokey FOO
GETEX
GETEX g PXAT 1
EXISTS g
GETEX g
"""

SCRIPTS["getdel_getset"] = """
SET d v
GETDEL d
GETDEL d
EXISTS d
GETDEL
GETDEL a b
GETSET d new
GETSET d newer
GET d
GETSET d
GETSET d a b
SET e 1 EX 100
GETSET e 2
TTL e
OBJECT ENCODING e
GETSET e abc
OBJECT ENCODING e
"""

SCRIPTS["mget_mset_msetnx"] = """
MSET a 1 b 2 c 3
MGET a b c d
MGET d
MSET a
MSET a 1 b
MSET
MGET
MSETNX a 1 x 2
MGET a x
MSETNX x 1 y 2
MSETNX x 1 y
MGET x y
MSETNX
MSETNX z
MSET {t}a 1 {t}b 2 {t}a 3
MGET {t}a {t}b
MSETNX {t}c 1 {t}c 2
GET {t}c
MSETNX n1 1 n2 2 n1 3
MGET n1 n2
MSET big1 12345678901234567890 big2 123456789012345678901
OBJECT ENCODING big1
OBJECT ENCODING big2
"""

SCRIPTS["append_strlen"] = """
APPEND ap hello
APPEND ap " world"
GET ap
STRLEN ap
STRLEN nokey
APPEND ap
APPEND ap a b
STRLEN
STRLEN a b
OBJECT ENCODING ap
APPEND n 123
OBJECT ENCODING n
APPEND n 4
OBJECT ENCODING n
GET n
SET m 12
APPEND m ""
OBJECT ENCODING m
SET ttl v EX 100
APPEND ttl x
~s TTL ttl
APPEND long xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx
OBJECT ENCODING long
APPEND emb 12345678901234567890123456789012345678901234
OBJECT ENCODING emb
APPEND emb2 123456789012345678901234567890123456789012345
OBJECT ENCODING emb2
"""

SCRIPTS["getrange_setrange"] = """
SET r "Hello World"
GETRANGE r 0 4
GETRANGE r -5 -1
GETRANGE r 0 -1
GETRANGE r 5 2
GETRANGE r -1 -5
GETRANGE r 100 200
GETRANGE r -100 100
GETRANGE r -100 -50
GETRANGE r 0 0
GETRANGE r -1 0
GETRANGE r 3 -100
GETRANGE r 10 10
GETRANGE r 11 11
GETRANGE r abc 1
GETRANGE r 1 abc
GETRANGE nokey 0 -1
GETRANGE nokey abc 1
GETRANGE r 9223372036854775807 -9223372036854775808
GETRANGE r -9223372036854775808 9223372036854775807
GETRANGE r 0 9223372036854775808
SUBSTR r 0 4
SUBSTR r -3 -1
GETRANGE r 0
SUBSTR r 0
SET empty ""
GETRANGE empty 0 -1
GETRANGE empty 0 0
GETRANGE empty -1 -1
SETRANGE r 6 Redis
GET r
SETRANGE r 20 xx
GET r
STRLEN r
SETRANGE r -1 x
SETRANGE r abc x
SETRANGE new 5 ab
GET new
OBJECT ENCODING new
SETRANGE new2 5 ""
EXISTS new2
SETRANGE r 0 ""
SETRANGE r 536870911 ""
SETRANGE r 536870912 x
SETRANGE r 536870911 xy
SETRANGE r 9223372036854775807 x
SETRANGE r 1
SET num 12345
SETRANGE num 0 9
OBJECT ENCODING num
GET num
SET num2 12345
SETRANGE num2 0 ""
OBJECT ENCODING num2
SETRANGE nokey -1 ""
SETRANGE nokey abc ""
SET ttl v EX 100
SETRANGE ttl 3 x
~s TTL ttl
"""

SCRIPTS["counters"] = """
SET i 10
INCR i
DECR i
INCRBY i 5
DECRBY i 3
GET i
OBJECT ENCODING i
INCRBY i abc
INCRBY i 1.5
INCRBY i ""
INCRBY i " 1"
INCRBY i +1
INCRBY i 01
INCRBY i -0
INCRBY i 9223372036854775807
DECRBY i 9223372036854775807
DECRBY i -9223372036854775808
INCRBY i -9223372036854775808
INCRBY i 9223372036854775808
SET max 9223372036854775807
INCR max
INCRBY max 0
SET min -9223372036854775808
DECR min
DECRBY min 1
INCRBY min -1
DECRBY i -9223372036854775808
SET s abc
INCR s
DECR s
INCRBY s 1
SET sp " 1"
INCR sp
SET z 01
INCR z
SET big 99999999999999999999
INCR big
SET f 1.5
INCR f
SET e ""
INCR e
INCR
INCR a b
INCRBY a
DECRBY a
DECRBY a 1 2
DECR
INCR new
DECR new2
INCRBY new3 -7
DECRBY new4 -7
MGET new new2 new3 new4
SET ttl 5 EX 100
INCR ttl
~s TTL ttl
OBJECT ENCODING ttl
SET n 12345678901234567890
OBJECT ENCODING n
"""

SCRIPTS["incrbyfloat_simple"] = """
INCRBYFLOAT f 1.5
INCRBYFLOAT f 1e3
INCRBYFLOAT f -0.5
GET f
OBJECT ENCODING f
INCRBYFLOAT f abc
INCRBYFLOAT f nan
INCRBYFLOAT f inf
INCRBYFLOAT f -inf
INCRBYFLOAT f " 1"
INCRBYFLOAT f "1 "
INCRBYFLOAT f ""
INCRBYFLOAT f 1e
INCRBYFLOAT f 1_0
INCRBYFLOAT g 3.0
INCRBYFLOAT g 0.5
INCRBYFLOAT h 10.50
GET h
OBJECT ENCODING h
INCRBYFLOAT i 3
OBJECT ENCODING i
INCRBYFLOAT f
INCRBYFLOAT
INCRBYFLOAT f 1 2
SET s abc
INCRBYFLOAT s 1
SET e 1 EX 100
INCRBYFLOAT e 1.5
~s TTL e
INCRBYFLOAT w5 +5
INCRBYFLOAT w6 1E2
INCRBYFLOAT w7 -1.25
INCRBYFLOAT w7 1.25
GET w7
INCRBYFLOAT w8 1e5000
INCRBYFLOAT w9 -0
"""

SCRIPTS["lcs"] = """
SET key1 ohmytext
SET key2 mynewtext
LCS key1 key2
LCS key1 key2 LEN
LCS key1 key2 IDX
LCS key1 key2 IDX MINMATCHLEN 4
LCS key1 key2 IDX MINMATCHLEN 4 WITHMATCHLEN
LCS key1 key2 IDX WITHMATCHLEN
LCS key1 key2 idx withmatchlen minmatchlen 0
LCS key1 key2 LEN IDX
LCS key1 key2 FOO
LCS key1 key2 MINMATCHLEN
LCS key1 key2 MINMATCHLEN abc
LCS key1 key2 MINMATCHLEN -5 IDX
LCS key1 key2 WITHMATCHLEN
LCS key1 key2 LEN WITHMATCHLEN
LCS key1 key2 LEN LEN
LCS key1 nokey
LCS nokey nokey2
LCS nokey nokey2 IDX
LCS nokey nokey2 LEN
LCS key1
LCS
SET k3 ""
LCS k3 key1 IDX
SET a1 abcdefgh
SET a2 abcxyzfgh
LCS a1 a2 IDX WITHMATCHLEN
LCS a1 a2
LCS a1 a1 IDX
LCS a2 a1 IDX WITHMATCHLEN
SET {x}1 ACCGGTCGAGTGCGCGGAAGCCGGCCGAA
SET {x}2 GTCGTTCGGAATGCCGTTGCTCTGTAAA
LCS {x}1 {x}2
LCS {x}1 {x}2 IDX MINMATCHLEN 2 WITHMATCHLEN
"""

SCRIPTS["del_exists_touch_type"] = """
SET a 1
SET b 2
DEL a b c
DEL a
DEL
UNLINK a
UNLINK
SET a 1
UNLINK a a
SET a 1
EXISTS a a b
EXISTS nokey
EXISTS
TOUCH a b a
TOUCH
TYPE a
TYPE nokey
TYPE
TYPE a b
SET {t}1 1
SET {t}2 2
DEL {t}1 {t}2 {t}3
MSET p 1 q 2 r 3 s 4 t 5
DEL p q r s t u v
EXISTS p q r
"""

SCRIPTS["rename_copy"] = """
SET a 1
RENAME a b
GET b
GET a
RENAME nokey x
RENAME b b
GET b
RENAME nokey nokey
RENAME b
RENAME b c d
RENAMENX b c
SET d 4
RENAMENX c d
RENAMENX c c
RENAMENX nokey c
RENAMENX nokey nokey
RENAMENX c
COPY c e
COPY c e
COPY c e REPLACE
COPY c c
COPY c c REPLACE
COPY nokey c
COPY nokey nokey
COPY c f DB 0
COPY c f DB 0 REPLACE
COPY c g REPLACE DB 0
COPY c f DB abc
COPY c f DB -1
COPY c f DB 2147483648
COPY c f FOO
COPY c f DB
COPY c f REPLACE REPLACE
COPY c
SET ttlk v EX 100
RENAME ttlk ttl2
~s TTL ttl2
COPY ttl2 ttl3
~s TTL ttl3
OBJECT ENCODING ttl3
SET i 42
COPY i i2
OBJECT ENCODING i2
SET x v
SET y w EX 100
RENAME x y
TTL y
SET {h}1 a
RENAME {h}1 {h}2
MGET {h}1 {h}2
SET ra 1
SET rb 2
RENAMENX ra rb
MGET ra rb
"""

SCRIPTS["expire_family"] = """
SET k v
EXPIRE k 100
~s TTL k
EXPIRE k 100 NX
EXPIRE k 200 XX
~s TTL k
EXPIRE k 50 GT
EXPIRE k 500 GT
~s TTL k
EXPIRE k 600 LT
EXPIRE k 50 LT
~s TTL k
EXPIRE k 10 NX XX
EXPIRE k 10 GT LT
EXPIRE k 10 NX GT
EXPIRE k 10 NX LT
EXPIRE k 10 FOO
EXPIRE k abc FOO
EXPIRE k 10 XX XX
EXPIRE k 20 gt GT
EXPIRE k abc
EXPIRE k 1.5
EXPIRE k ""
EXPIRE k
EXPIRE
EXPIRE nokey 10
EXPIRE nokey 10 FOO
EXPIRE nokey abc
EXPIRE nokey 10 NX XX
EXPIRE k 9223372036854775807
EXPIRE k -9223372036854775808
EXPIRE k 9223372036854775
EXPIRE k 9223372036854776
EXPIRE k -9223372036854776
PEXPIRE k 9223372036854775807
EXPIREAT k 9223372036854775807
PEXPIREAT k 9223372036854775807
~s TTL k
PERSIST k
PERSIST k
TTL k
EXPIRE k 100 XX
EXPIRE k 100 LT
~s TTL k
EXPIRE k 200 GT
PERSIST nokey
PERSIST
PERSIST a b
SET k2 v
EXPIRE k2 -1
EXISTS k2
SET k3 v
PEXPIRE k3 0
EXISTS k3
SET k4 v
EXPIREAT k4 1
EXISTS k4
SET k5 v
PEXPIREAT k5 1000
EXISTS k5
SET k6 v
EXPIRETIME k6
PEXPIRETIME k6
EXPIRETIME nokey
PEXPIRETIME nokey
EXPIREAT k6 99999999999
EXPIRETIME k6
PEXPIRETIME k6
PEXPIREAT k6 99999999999999
PEXPIRETIME k6
EXPIRETIME k6
PEXPIREAT k6 99999999999498
EXPIRETIME k6
PEXPIREAT k6 99999999999499
EXPIRETIME k6
PEXPIREAT k6 99999999999500
EXPIRETIME k6
TTL nokey
PTTL nokey
TTL k6 x
EXPIRETIME
PEXPIRETIME a b
SET k7 v
EXPIRE k7 100 gt
EXPIRE k7 100 lt
~s TTL k7
SET k8 v
EXPIRE k8 100 nx
EXPIRE k8 -1 gt
EXPIRE k8 -1 lt
EXISTS k8
SET k9 v
EXPIREAT k9 99999999999 NX
EXPIREAT k9 99999999998 GT
EXPIREAT k9 99999999998 LT
EXPIRETIME k9
PEXPIREAT k9 99999999998000 GT
PEXPIREAT k9 99999999999000 GT
PEXPIRETIME k9
"""

SCRIPTS["object"] = """
SET s hello
OBJECT ENCODING s
OBJECT encoding s
OBJECT ENCODING nokey
OBJECT ENCODING
OBJECT
OBJECT FOO
OBJECT FOO s
OBJECT ENCODING s extra
OBJECT REFCOUNT nokey
OBJECT FREQ s
OBJECT HELP
OBJECT help
OBJECT HELP extra
SET n 12345
OBJECT ENCODING n
SET n -1
OBJECT ENCODING n
SET n 01
OBJECT ENCODING n
SET n 12345678901234567890
OBJECT ENCODING n
SET n 9223372036854775807
OBJECT ENCODING n
SET n 9223372036854775808
OBJECT ENCODING n
SET n -9223372036854775808
OBJECT ENCODING n
SET n 123456789012345678901234567890123456789012345
OBJECT ENCODING n
SET n 12345678901234567890123456789012345678901234
OBJECT ENCODING n
SET n " 1"
OBJECT ENCODING n
SET n ""
OBJECT ENCODING n
SET n 0
OBJECT ENCODING n
SET n -0
OBJECT ENCODING n
SET n +1
OBJECT ENCODING n
SET n 1.5
OBJECT ENCODING n
SETEX n 100 123
OBJECT ENCODING n
SETRANGE n3 0 123
OBJECT ENCODING n3
INCR n4
OBJECT ENCODING n4
INCRBY n4 1000000000000
OBJECT ENCODING n4
GETSET n5 99
OBJECT ENCODING n5
MSET m1 5 m2 abc
OBJECT ENCODING m1
OBJECT ENCODING m2
SETNX m3 77
OBJECT ENCODING m3
SET n6 10
RENAME n6 n7
OBJECT ENCODING n7
COPY n7 n8
OBJECT ENCODING n8
SET bigs xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx
OBJECT ENCODING bigs
SET emb 12345678901234567890123456789012345678901234x
OBJECT ENCODING emb
APPEND emb ""
OBJECT ENCODING emb
"""

SCRIPTS["connection"] = """
PING
PING hello
PING ""
PING a b
ping
ECHO hi
ECHO ""
ECHO
ECHO a b
SELECT 0
SELECT -1
SELECT abc
SELECT 1.5
SELECT ""
SELECT 2147483648
SELECT 9223372036854775808
SELECT
SELECT 0 1
"""

SCRIPTS["keys_dbsize_flush"] = """
MSET foo 1 foobar 2 bar 3 fo 4 f[o] 5 "a b" 6 "" 7 a\\b 8
@set KEYS *
@set KEYS f*
@set KEYS f?o
@set KEYS f[a-o]*
@set KEYS f[^o]*
@set KEYS *o*
@set KEYS "a b"
@set KEYS "f\\\\[o\\\\]"
@set KEYS nomatch*
@set KEYS ""
@set KEYS "*\\\\\\\\*"
KEYS
KEYS a b
DBSIZE
DBSIZE x
RANDOMKEY x
FLUSHALL x
FLUSHDB foo
FLUSHDB ASYNC extra
FLUSHALL ASYNC
DBSIZE
RANDOMKEY
MSET a 1 b 2
FLUSHALL SYNC
DBSIZE
MSET a 1 b 2
FLUSHDB
DBSIZE
FLUSHDB async
FLUSHALL sync
"""

SCRIPTS["scan_errors"] = """
SCAN
SCAN abc
SCAN 0 COUNT 0
SCAN 0 COUNT -1
SCAN 0 COUNT abc
SCAN 0 COUNT 1.5
SCAN 0 MATCH
SCAN 0 COUNT
SCAN 0 FOO bar
SCAN 0 MATCH * FOO
SCAN 18446744073709551616
SCAN 1.5
SCAN " 0"
SCAN "0 "
SCAN -
SCAN +
SCAN 0 TYPE list
SCAN 0 TYPE hash COUNT 1000
SCAN 0 TYPE string
SCAN ""
SCAN +0
SCAN -0
"""

SCRIPTS["unknown_commands"] = """
FOO
FOO bar baz
foo "a b"
NOTACOMMAND a b c d e f g h i j k l m n o p q r s t u v w x y z
"x\\ny" "a\\r\\nb"
OBJECT FOO x
COMMAND FOO
CONFIG FOO
CLIENT FOO
MEMORY FOO
"""


SCRIPTS["bitmaps"] = """
SETBIT b 7 1
SETBIT b 7 1
SETBIT b 7 0
SETBIT b 100 1
GET b
STRLEN b
GETBIT b 100
GETBIT b 101
GETBIT b 100000
GETBIT nokey 3
SETBIT b -1 1
SETBIT b 4294967296 1
SETBIT b 0 2
SETBIT b 0 -1
SETBIT b abc 1
GETBIT b -1
GETBIT b abc
SET s foobar
BITCOUNT s
BITCOUNT s 0 0
BITCOUNT s 1 1
BITCOUNT s 1 -2
BITCOUNT s -6 -7
BITCOUNT s 5 30 BIT
BITCOUNT s 0 -1 BYTE
BITCOUNT s 0 -1 bit
BITCOUNT s 0
BITCOUNT s 0 1 FOO
BITCOUNT s a b
BITCOUNT nokey
BITCOUNT nokey 0 1
BITPOS s 1
BITPOS s 0
BITPOS s 1 2
BITPOS s 1 2 -1
BITPOS s 0 2 -1
BITPOS s 1 7 15 BIT
BITPOS s 0 0 -1 BIT
BITPOS s 2
BITPOS s 1 0 1 FOO
BITPOS s 1 a
BITPOS nokey 1
BITPOS nokey 0
BITPOS nokey 0 a b
SET ff "\xff\xff"
BITPOS ff 0
BITPOS ff 0 0 -1
BITPOS ff 1 1
SET empty ""
BITPOS empty 0
BITPOS empty 1
BITCOUNT empty
SET {t}x abc
SET {t}y "a b\x00"
BITOP AND {t}d {t}x {t}y
GET {t}d
BITOP OR {t}d {t}x {t}y {t}none
GET {t}d
BITOP XOR {t}d {t}x {t}y
GET {t}d
BITOP NOT {t}d {t}x
GET {t}d
BITOP NOT {t}d {t}x {t}y
BITOP FOO {t}d {t}x
SET {t}d x EX 100
BITOP AND {t}d {t}none1 {t}none2
EXISTS {t}d
BITOP OR {t}d {t}x
TTL {t}d
BITFIELD bf SET u8 0 255 GET u8 0 GET i8 0 GET u4 4 GET i4 #1
BITFIELD bf INCRBY u8 0 1 INCRBY i8 8 -129 OVERFLOW SAT INCRBY i8 8 -200 INCRBY u2 100 5
BITFIELD bf OVERFLOW FAIL INCRBY u2 102 5 GET u2 102 OVERFLOW WRAP INCRBY u2 102 5
BITFIELD bf SET i64 0 -1 GET i64 0 GET u63 1 INCRBY i64 0 -9223372036854775807 OVERFLOW SAT INCRBY i64 0 -100
BITFIELD bf OVERFLOW SAT SET i8 0 1000 SET u8 8 -5 OVERFLOW FAIL SET i8 16 200 GET i8 16
BITFIELD bf GET u64 0
BITFIELD bf GET i65 0
BITFIELD bf GET x8 0
BITFIELD bf GET u8 -1
BITFIELD bf GET u8 #-1
BITFIELD bf GET u8 abc
BITFIELD bf SET u8 0 abc
BITFIELD bf OVERFLOW FOO
BITFIELD bf GET u8
BITFIELD bf FOO
BITFIELD bf
GET bf
BITFIELD bfnew OVERFLOW FAIL INCRBY u8 80 300
STRLEN bfnew
BITFIELD bfmissing GET u8 0 GET i16 100
EXISTS bfmissing
BITFIELD_RO bf GET u8 0 GET i4 12
BITFIELD_RO bf SET u8 0 1
BITFIELD_RO bf OVERFLOW SAT
BITFIELD_RO bf
"""


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script(d: Differ, name: str) -> None:
    d.run_script(SCRIPTS[name])


def test_unknown_command_argument_truncation(d: Differ) -> None:
    # The args list stops after 128 bytes; each arg is cut to what is left.
    d.same("NOPE", "a" * 100, "b" * 100, "c" * 10)
    d.same("NOPE", "a" * 126, "b", "c")
    d.same("x" * 300, "y")
    d.same("NOPE", *["ab"] * 200)


def test_nul_bytes_in_arguments(d: Differ) -> None:
    d.same("SET", b"k\x00ey", b"v\x00al")
    d.same("GET", b"k\x00ey")
    d.same("ECHO", b"a\x00b")
    d.same("STRLEN", b"k\x00ey")
    # Error texts stop at the NUL, as Redis formats them with %s.
    d.same(b"NO\x00PE", b"a\x00b", b"c")
    d.same("EXPIRE", b"k\x00ey", "10", b"x\x00y")


@pytest.mark.xfail(
    reason="kvtier's error replies are UTF-8 strings: a non-UTF-8 byte in an "
    "echoed argument becomes U+FFFD, where Redis echoes the raw byte",
    strict=True,
)
def test_non_utf8_bytes_in_error_texts(d: Differ) -> None:
    d.same(b"NO\xffPE", b"\xfe")


def test_binary_values(d: Differ) -> None:
    value = bytes(range(256)) * 4
    d.same("SET", "bin", value)
    d.same("GET", "bin")
    d.same("APPEND", "bin", b"\r\n\x00")
    d.same("GETRANGE", "bin", "250", "260")
    d.same("SETRANGE", "bin", "1", b"\xff\xfe")
    d.same("STRLEN", "bin")
    d.same("LCS", "bin", "bin", "LEN")


# ---------------------------------------------------------------------------
# Arity and argument types, command by command
# ---------------------------------------------------------------------------

#: Commands of the string and generic groups, plus the connection commands in
#: scope. (SHUTDOWN, DEBUG, QUIT, RESET, HELLO, AUTH and server introspection
#: are left out: their replies describe the server, not the data.)
ARITY_COMMANDS = """
get set setnx setex psetex getex getdel getset mget mset msetnx append strlen
getrange substr setrange incr decr incrby decrby incrbyfloat lcs del unlink
exists touch type rename renamenx copy expire pexpire expireat pexpireat ttl
pttl expiretime pexpiretime persist keys scan randomkey dbsize select echo ping
object
""".split()


@pytest.mark.parametrize("command", ARITY_COMMANDS)
def test_arity(d: Differ, command: str) -> None:
    # "0" rather than "1" for SELECT: kvtier has only db 0 (intended).
    number = "0" if command == "select" else "1"
    for argc in range(0, 6):
        d.same("FLUSHALL")
        d.same(command, *["x"] * argc)
        d.same("FLUSHALL")
        d.same(command.upper(), *[number] * argc)


BAD_INTEGERS = [
    "abc", "1.5", "", " 1", "1 ", "+1", "01", "0x10", "1e3", "-", "--1",
    "9223372036854775808", "-9223372036854775809", "99999999999999999999999",
]

INTEGER_ARGUMENTS = [
    "SETEX k {} v",
    "PSETEX k {} v",
    "SET k v EX {}",
    "SET k v PX {}",
    "SET k v EXAT {}",
    "SET k v PXAT {}",
    "GETEX k EX {}",
    "GETEX k PXAT {}",
    "GETRANGE k {} 1",
    "GETRANGE k 0 {}",
    "SETRANGE k {} v",
    "INCRBY k {}",
    "DECRBY k {}",
    "EXPIRE k {}",
    "PEXPIRE k {}",
    "EXPIREAT k {}",
    "PEXPIREAT k {}",
    "EXPIRE k {} NX",
    "LCS k k MINMATCHLEN {}",
    "SCAN 0 COUNT {}",
    "SCAN {}",
    "SELECT {}",
    "COPY k k2 DB {}",
    "INCRBYFLOAT k {}",
]


@pytest.mark.parametrize("template", INTEGER_ARGUMENTS)
def test_wrong_integer_arguments(d: Differ, template: str) -> None:
    for bad in BAD_INTEGERS:
        if template.startswith("SCAN {}"):
            # A cursor other than 0 means different things to the two
            # servers; on an empty database every cursor finds nothing.
            d.same("FLUSHALL")
        else:
            d.same("SET", "k", "12")
        parts = template.split(" ")
        cmd = [bad if p == "{}" else p for p in parts]
        d.same(*cmd)
    d.same("GET", "k")


# ---------------------------------------------------------------------------
# Protocol errors and inline commands, over fresh connections
# ---------------------------------------------------------------------------

#: (input, mode): "closes" — the server answers and closes the connection;
#: "marker" — the input is complete, so an ECHO sent after it must come back;
#: "waits" — the input is incomplete: nothing more comes for a while.
PROTOCOL_CASES = [
    (b"*1\r\n$-5\r\n", "closes"),
    (b"*1\r\n$abc\r\n", "closes"),
    (b"*abc\r\n", "closes"),
    (b"*1\r\n$-1\r\n", "closes"),
    (b"*+1\r\n$4\r\nPING\r\n", "closes"),
    (b"*01\r\n$4\r\nPING\r\n", "closes"),
    (b"*1\r\n$04\r\nPING\r\n", "closes"),
    (b"*1\r\n$+4\r\nPING\r\n", "closes"),
    (b"*1\r\n$ 4\r\n", "closes"),
    (b"* 1\r\n", "closes"),
    (b"*2\r\n$4\r\nPING\r\n:5\r\n", "closes"),
    (b"*1\r\nx\r\n", "closes"),
    (b"*1\r\n$512000000000\r\n", "closes"),
    (b"*1\r\n$536870913\r\n", "closes"),
    (b"*1\r\n$9223372036854775808\r\n", "closes"),
    (b"*9223372036854775808\r\n", "closes"),
    (b"*2147483648\r\n", "closes"),
    (b"echo \"abc\r\n", "closes"),
    (b"echo 'abc\r\n", "closes"),
    (b"echo \"a\"b\r\n", "closes"),
    (b"echo 'a'b\r\n", "closes"),
    (b"x" * 70000, "closes"),
    (b"*" + b"1" * 70000, "closes"),
    (b"*1\r\n$" + b"1" * 70000, "closes"),
    (b"PING\r\n*1\r\n$-5\r\n", "closes"),
    (b"*-1\r\nPING\r\n", "marker"),
    (b"*0\r\nPING\r\n", "marker"),
    (b"*-5\r\n*1\r\n$4\r\nPING\r\n", "marker"),
    (b"*1\r\n$4\r\nPINGxx", "marker"),
    (b"$4\r\nPING\r\n", "marker"),
    (b"PING\r\n", "marker"),
    (b"ping hello\r\n", "marker"),
    (b"PING\n", "marker"),
    (b"  PING  \r\n", "marker"),
    (b"\r\n\r\nPING\r\n", "marker"),
    (b"\n", "marker"),
    (b"   \r\n", "marker"),
    (b"set a \"b c\"\r\nget a\r\n", "marker"),
    (b"set a 'x\\'y'\r\nget a\r\n", "marker"),
    (b"echo \"\\x41\\x42\\n\\t\\r\\a\\b\\\\\\\"\"\r\n", "marker"),
    (b"echo \"\\xZZ\"\r\n", "marker"),
    (b"echo '\\n'\r\n", "marker"),
    (b"echo a\tb\r\n", "marker"),
    (b"set k\"x\" v\r\n", "marker"),
    (b"GET\r\n", "marker"),
    (b"UNKNOWNCMD a b\r\n", "marker"),
    (b"*1\r\n$0\r\n\r\n", "marker"),
    (b"\"\"\r\n", "marker"),
    (b"*1\r\n$4\r\nPING\n\n", "marker"),
    (b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\nbXY*1\r\n$3\r\nGET\r\n$1\r\na\r\n", "marker"),
    (b"*2\r\n$4\r\nECHO\r\n$3\r\na\x00b\r\n", "marker"),
    (b"*1\r\n$4\r\nP\x00NG\r\n", "marker"),
    (b"*1048577\r\n", "waits"),
    (b"*3000000\r\n$4\r\nPING\r\n", "waits"),
    (b"*2\r\n$3\r\nGET\r\n", "waits"),
    (b"*1\r\n$4\r\nPI", "waits"),
    (b"PING", "waits"),
    # Not compared: `ECHO a\0b\r\n` inline. Redis looks for the newline with
    # strchr, which stops at the NUL, so it waits for ever; kvtier answers
    # `a`. No client sends NUL bytes in inline commands.
]

MARKER = encode("ECHO", "end-of-case-marker")


def _exchange(host: str, port: int, data: bytes, mode: str) -> tuple[bytes, bool]:
    """Sends `data` on a fresh connection; returns what came back and
    whether the server closed the connection."""
    with RawConnection(host, port, timeout=5) as c:
        if mode == "marker":
            c.send(data + MARKER)
            want = b"$18\r\nend-of-case-marker\r\n"
            deadline = time.monotonic() + 5
            while not c.buf.endswith(want):
                c._fill(deadline)
            return c.buf[: -len(want)], False
        c.send(data)
        if mode == "closes":
            return c.read_all_until_close(), True
        # "waits": nothing may come back within a short while.
        c.sock.settimeout(0.3)
        try:
            got = c.sock.recv(65536)
        except socket.timeout:
            got = b""
        return got, got == b""


#: kvtier's one addition to Redis's protocol errors: a bulk over the limit
#: names the limit after Redis's words (docs/commands.md), compared without.
LIMIT_NAMED = re.compile(rb"(invalid bulk length) \(\d+ bytes, over proto-max-bulk-len \d+\)(?=\r\n)")


@pytest.mark.parametrize("data,mode", PROTOCOL_CASES, ids=[repr(c[0][:24]) for c in PROTOCOL_CASES])
def test_protocol(redis_server, kvtier, ref, kv, data: bytes, mode: str) -> None:
    want = _exchange(redis_server.host, redis_server.port, data, mode)
    got = _exchange(kvtier.host, kvtier.port, data, mode)
    got = (LIMIT_NAMED.sub(rb"\1", got[0]), got[1])
    assert got == want, f"redis: {want!r}\nkvtier: {got!r}"


def test_pipelined_mixed_errors(d: Differ) -> None:
    commands = [
        ("SET", "a", "1"),
        ("INCR", "a"),
        ("GET",),
        ("NOPE", "x"),
        ("SET", "a", "v", "EX", "0"),
        ("INCRBY", "a", "x"),
        ("MGET", "a", "b", "{a}c"),
        ("EXPIRE", "a", "100", "NX"),
        ("EXPIRE", "a", "100", "NX"),
        ("DEL", "a", "b"),
        ("PING",),
    ] * 50
    assert d.kv.pipeline(commands) == d.ref.pipeline(commands)


# ---------------------------------------------------------------------------
# Intended differences: pinned here so that they stay deliberate
# ---------------------------------------------------------------------------


def test_intended_differences(d: Differ) -> None:
    d.same("SET", "c", "v")
    # kvtier has only db 0: other databases are out of range (Redis has 16).
    assert d.kv.call("SELECT", "1") == b"-ERR DB index is out of range\r\n"
    assert d.kv.call("SELECT", "15") == b"-ERR DB index is out of range\r\n"
    assert d.kv.call("COPY", "c", "f", "DB", "1") == b"-ERR DB index is out of range\r\n"
    assert parse(d.kv.call("CONFIG", "GET", "databases")) == [b"databases", b"1"]
    # kvtier reports Redis 7.2.4 (the reference here is 7.0).
    hello = dict(parse(d.kv.call("HELLO", "2"))[i : i + 2] for i in range(0, 14, 2))
    assert hello[b"version"] == b"7.2.4"
    assert b"redis_version:7.2.4" in parse(d.kv.call("INFO", "server"))
    # Only strings: SCAN TYPE for another type finds nothing, TYPE says string.
    assert parse(d.kv.call("SCAN", "0", "TYPE", "list", "COUNT", "1000")) == [b"0", []]
    assert d.kv.call("TYPE", "c") == b"+string\r\n"


# ---------------------------------------------------------------------------
# SCAN as a whole
# ---------------------------------------------------------------------------


def test_scan_visits_the_same_keys(d: Differ) -> None:
    keys = [f"key:{i}" for i in range(500)] + [f"{{tag}}:{i}" for i in range(50)] + ["other", "x*y"]
    for i in range(0, len(keys), 100):
        batch = keys[i : i + 100]
        d.same("MSET", *[x for k in batch for x in (k, k)])
    assert len(d.scan_all()) == len(keys)
    assert len(d.scan_all("COUNT", "7")) == len(keys)
    assert len(d.scan_all("MATCH", "key:1*", "COUNT", "50")) == 111
    assert len(d.scan_all("MATCH", "{tag}*")) == 50
    assert d.scan_all("MATCH", "x\\*y") == {b"x*y"}
    assert d.scan_all("MATCH", "nothing*") == set()
    assert len(d.scan_all("TYPE", "string", "COUNT", "1000")) == len(keys)
    assert len(d.same_set("KEYS", "*")) == len(keys)
    d.same("DBSIZE")


def test_expired_keys_disappear(d: Differ) -> None:
    d.same("SET", "short", "v", "PX", "50")
    d.same("PSETEX", "short2", "50", "v")
    d.same("SET", "long", "v", "EX", "100")
    d.same("SET", "getex", "v")
    d.same("GETEX", "getex", "PX", "50")
    d.same("SET", "pexp", "v")
    d.same("PEXPIRE", "pexp", "50")
    time.sleep(0.2)
    for key in ("short", "short2", "getex", "pexp", "long"):
        d.same("GET", key)
        d.same("EXISTS", key)
        d.same("TTL", key)
    d.same("DBSIZE")
    d.same_set("KEYS", "*")
    d.scan_all()


def test_randomkey_answers_an_existing_key(d: Differ) -> None:
    # RANDOMKEY is random: only check that the answer is a key.
    assert d.kv.call("RANDOMKEY") == d.ref.call("RANDOMKEY") == b"$-1\r\n"
    d.same("MSET", "a", "1", "b", "2", "{b}c", "3")
    for _ in range(20):
        key = parse(d.kv.call("RANDOMKEY"))
        assert key in (b"a", b"b", b"{b}c")


# ---------------------------------------------------------------------------
# RESP3
# ---------------------------------------------------------------------------

RESP3_SCRIPT = """
SET key1 ohmytext
SET key2 mynewtext
LCS key1 key2 IDX WITHMATCHLEN
LCS key1 key2 IDX MINMATCHLEN 4
LCS key1 key2 LEN
GET nokey
MGET key1 nokey
SET x 1.5
INCRBYFLOAT x 1
TTL key1
EXISTS key1 nokey
OBJECT ENCODING nokey
SET k v GET
SET k2 v NX
SET k2 v NX
GETEX nokey
GETDEL nokey
ECHO hi
PING
COPY key1 key3
SETNX key1 x
MSETNX key1 x
DBSIZE
TYPE key1
RENAMENX key1 key2
PERSIST key1
GETRANGE nokey 0 -1
INCR nokey
SET a b XX
SCAN 0 MATCH nothing
KEYS nothing
NOPE
GET
"""


def test_resp3_replies(d: Differ) -> None:
    want, got = d.both("HELLO", "3")
    assert parse(got)[2] == (b"proto", 3) and parse(want)[2] == (b"proto", 3)
    d.run_script(RESP3_SCRIPT)
    # Back to RESP2 on the same connection.
    d.ref.call("HELLO", "2")
    d.kv.call("HELLO", "2")
    d.same("GET", "nokey")


# ---------------------------------------------------------------------------
# redis-py against both servers
# ---------------------------------------------------------------------------


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except redis.ResponseError as e:
        return ("error", str(e))


def _redis_py_session(r: redis.Redis) -> list:
    r.flushall()
    out = []
    steps: list[Callable[[], Any]] = [
        lambda: r.set("k", "v", ex=100, get=True),
        lambda: r.set("k", "v2", nx=True, get=True),
        lambda: r.set("k", "v3", xx=True, keepttl=True),
        lambda: r.ttl("k"),
        lambda: r.getex("k", persist=True),
        lambda: r.ttl("k"),
        lambda: r.getdel("k"),
        lambda: r.getset("k", "x"),
        lambda: r.mset({"a": 1, "b": 2, "{a}c": 3}),
        lambda: r.mget(["a", "b", "{a}c", "d"]),
        lambda: r.msetnx({"a": 9, "e": 5}),
        lambda: r.msetnx({"f": 9, "g": 5}),
        lambda: r.append("a", "23"),
        lambda: r.strlen("a"),
        lambda: r.getrange("a", 1, -1),
        lambda: r.setrange("a", 5, "x"),
        lambda: r.get("a"),
        lambda: r.incr("n"),
        lambda: r.incrby("n", 10),
        lambda: r.decr("n"),
        lambda: r.decrby("n", 3),
        lambda: r.incrbyfloat("fl", 2.5),
        lambda: r.incr("k"),
        lambda: r.incrbyfloat("k", 1),
        lambda: r.lcs("a", "b"),
        lambda: r.exists("a", "b", "zz"),
        lambda: r.touch("a", "zz"),
        lambda: r.type("a"),
        lambda: r.rename("a", "a2"),
        lambda: r.renamenx("a2", "b"),
        lambda: r.copy("a2", "a3"),
        lambda: r.copy("a2", "a3", replace=True),
        lambda: r.expire("a2", 100, nx=True),
        lambda: r.expire("a2", 50, gt=True),
        lambda: r.expireat("a2", 99999999999, xx=True),
        lambda: r.expiretime("a2"),
        lambda: r.pexpireat("a2", 99999999999000, lt=True),
        lambda: r.pexpiretime("a2"),
        lambda: r.persist("a2"),
        lambda: r.ttl("a2"),
        lambda: r.pttl("nokey"),
        lambda: r.object("encoding", "n"),
        lambda: r.delete("a2", "a3", "nokey"),
        lambda: r.unlink("b", "e"),
        lambda: r.dbsize(),
        lambda: sorted(r.keys("*")),
        lambda: sorted(r.scan_iter(match="*", count=3)),
        lambda: r.echo("hello"),
        lambda: r.ping(),
        lambda: r.execute_command("SET", "x", "y", "EX", "0"),
        lambda: r.execute_command("NOPE"),
        lambda: r.execute_command("GET"),
    ]
    for step in steps:
        out.append(_outcome(step))
    pipe = r.pipeline(transaction=False)
    pipe.set("p", 1).incr("p").incr("k").get("p").expire("p", 10, xx=True).ttl("p")
    out.append(pipe.execute(raise_on_error=False))
    return [repr(x) for x in out]


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_session(redis_server, kvtier, protocol: int) -> None:
    clients = [
        redis.Redis(host=s.host, port=s.port, protocol=protocol, socket_timeout=10, socket_connect_timeout=5)
        for s in (redis_server, kvtier)
    ]
    try:
        want, got = (_redis_py_session(r) for r in clients)
    finally:
        for r in clients:
            r.close()
    for i, (w, g) in enumerate(zip(want, got)):
        assert g == w, f"step {i}: redis {w} kvtier {g}"


# ---------------------------------------------------------------------------
# Randomized differential run
# ---------------------------------------------------------------------------

KEYS = ["k0", "k1", "k2", "k3", "{t}a", "{t}b", "{t}c", "n0", "n1", "f0"]
VALUES = ["", "0", "1", "-1", "7", "42", "10", "abc", "hello world", "9223372036854775807",
          "-9223372036854775808", "3.5", "-2.25", "1e3", " 1", "01", "x" * 50, "12345678901234567890123"]


class CommandGenerator:
    """Random string and key commands over a small key space. Expiry times
    are far apart (relative: 1000-5000 s; absolute: fixed, far beyond) so
    that two servers a few microseconds apart never order them differently."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.absolute_base = 4_000_000_000  # seconds: year 2096

    def key(self) -> str:
        return self.rng.choice(KEYS)

    def value(self) -> str:
        return self.rng.choice(VALUES)

    def int_arg(self) -> str:
        return self.rng.choice(["0", "1", "-1", "3", "-7", "100", "abc", "9223372036854775807", "-9223372036854775808"])

    def relative(self, unit_ms: bool) -> str:
        seconds = self.rng.randint(1000, 5000)
        return str(seconds * 1000 + self.rng.randint(0, 999) if unit_ms else seconds)

    def absolute(self, unit_ms: bool) -> str:
        if self.rng.random() < 0.1:
            return "1"  # in the past: the key is deleted
        seconds = self.absolute_base + self.rng.randint(0, 10_000)
        return str(seconds * 1000 + self.rng.randint(0, 999) if unit_ms else seconds)

    def set_options(self) -> list[str]:
        opts: list[str] = []
        r = self.rng
        if r.random() < 0.3:
            opts.append(r.choice(["NX", "XX"]))
        if r.random() < 0.3:
            opts.append("GET")
        roll = r.random()
        if roll < 0.15:
            opts += ["EX", self.relative(False)]
        elif roll < 0.25:
            opts += ["PX", self.relative(True)]
        elif roll < 0.35:
            opts += ["EXAT", self.absolute(False)]
        elif roll < 0.4:
            opts += ["PXAT", self.absolute(True)]
        elif roll < 0.5:
            opts.append("KEEPTTL")
        elif roll < 0.53:
            opts += r.choice([["EX", "0"], ["FOO"], ["EX", "10", "PX", "10"], ["EX"], ["NX", "XX"]])
        r.shuffle(opts) if r.random() < 0.1 else None
        return opts

    def command(self) -> tuple[str, list[str]]:
        """A command and how to compare it: "exact", "ttl", "pttl"."""
        r = self.rng
        k, v = self.key(), self.value()
        choice = r.randrange(44)
        table: list[Callable[[], tuple[str, list[str]]]] = [
            lambda: ("exact", ["GET", k]),
            lambda: ("exact", ["SET", k, v, *self.set_options()]),
            lambda: ("exact", ["SET", k, v]),
            lambda: ("exact", ["SETNX", k, v]),
            lambda: ("exact", ["SETEX", k, r.choice([self.relative(False), "0", "-1", "x"]), v]),
            lambda: ("exact", ["PSETEX", k, r.choice([self.relative(True), "0"]), v]),
            lambda: ("exact", ["GETEX", k, *r.choice([[], ["PERSIST"], ["EX", self.relative(False)],
                                                      ["PXAT", self.absolute(True)], ["EX", "0"], ["KEEPTTL"]])]),
            lambda: ("exact", ["GETDEL", k]),
            lambda: ("exact", ["GETSET", k, v]),
            lambda: ("exact", ["MGET", *r.sample(KEYS, r.randint(1, 5))]),
            lambda: ("exact", ["MSET", *[x for key in r.sample(KEYS, r.randint(1, 4)) for x in (key, self.value())]]),
            lambda: ("exact", ["MSETNX", *[x for key in r.sample(KEYS, r.randint(1, 3)) for x in (key, self.value())]]),
            lambda: ("exact", ["APPEND", k, v]),
            lambda: ("exact", ["STRLEN", k]),
            lambda: ("exact", ["GETRANGE", k, self.int_arg(), self.int_arg()]),
            lambda: ("exact", ["SETRANGE", k, str(r.randint(-1, 40)), v]),
            lambda: ("exact", ["INCR", k]),
            lambda: ("exact", ["DECR", k]),
            lambda: ("exact", ["INCRBY", k, self.int_arg()]),
            lambda: ("exact", ["DECRBY", k, self.int_arg()]),
            lambda: ("exact", ["INCRBYFLOAT", k, r.choice(["1", "-1", "0.5", "2.5", "-0.25", "10", "1e2", "x", "0"])]),
            lambda: ("exact", ["LCS", k, self.key(), *r.choice([[], ["LEN"], ["IDX"], ["IDX", "WITHMATCHLEN"],
                                                                ["IDX", "MINMATCHLEN", "2"]])]),
            lambda: ("exact", ["DEL", *r.sample(KEYS, r.randint(1, 3))]),
            lambda: ("exact", ["UNLINK", *r.sample(KEYS, r.randint(1, 3))]),
            lambda: ("exact", ["EXISTS", *[self.key() for _ in range(r.randint(1, 4))]]),
            lambda: ("exact", ["TOUCH", *r.sample(KEYS, r.randint(1, 3))]),
            lambda: ("exact", ["TYPE", k]),
            lambda: ("exact", ["RENAME", k, self.key()]),
            lambda: ("exact", ["RENAMENX", k, self.key()]),
            lambda: ("exact", ["COPY", k, self.key(), *r.choice([[], ["REPLACE"], ["DB", "0"]])]),
            lambda: ("exact", [r.choice(["EXPIRE", "PEXPIRE"]), k, self.relative(r.random() < 0.5),
                               *r.choice([[], ["NX"], ["XX"], ["FOO"], ["NX", "XX"]])]),
            lambda: ("exact", ["EXPIRE", k, r.choice(["0", "-1", "x"])]),
            lambda: ("exact", ["EXPIREAT", k, self.absolute(False), *r.choice([[], ["NX"], ["XX"], ["GT"], ["LT"]])]),
            lambda: ("exact", ["PEXPIREAT", k, self.absolute(True), *r.choice([[], ["NX"], ["XX"], ["GT"], ["LT"]])]),
            lambda: ("ttl", ["TTL", k]),
            lambda: ("pttl", ["PTTL", k]),
            lambda: ("ttl", ["EXPIRETIME", k]),
            lambda: ("pttl", ["PEXPIRETIME", k]),
            lambda: ("exact", ["PERSIST", k]),
            lambda: ("exact", ["OBJECT", "ENCODING", k]),
            # No DBSIZE: Redis 7.0 keeps a key SET with a past EXAT/PXAT until
            # it is touched or actively expired, and DBSIZE counts it until
            # then (kvtier deletes it at once, as Redis ends up doing).
            lambda: ("exact", ["EXISTS", k]),
            lambda: ("set", ["KEYS", r.choice(["*", "k*", "{t}*", "?0", "*[ab]"])]),
            lambda: ("exact", [r.choice(["GET", "SET", "INCR", "EXPIRE", "MSET"])]),  # arity errors
            lambda: ("exact", ["ECHO", v]),
        ]
        return table[choice]()


RANDOM_SEEDS = [int(s) for s in os.environ.get("KVTIER_DIFF_SEEDS", "1,2,3").split(",")]
RANDOM_COMMANDS = int(os.environ.get("KVTIER_DIFF_COMMANDS", "1500"))


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_commands(d: Differ, seed: int) -> None:
    gen = CommandGenerator(seed)
    history: list[str] = []
    for i in range(RANDOM_COMMANDS):
        mode, cmd = gen.command()
        history.append(" ".join(repr(a) if (" " in a or not a) else a for a in cmd))
        try:
            if mode == "exact":
                d.same(*cmd)
            elif mode == "ttl":
                d.close(*cmd, tolerance=1)
            elif mode == "pttl":
                d.close(*cmd, tolerance=1500)
            else:
                d.same_set(*cmd)
            if i % 200 == 199:
                d.scan_all()
        except AssertionError as e:
            recent = "\n".join(history[-25:])
            raise AssertionError(f"seed {seed}, command #{i}: {e}\nlast commands:\n{recent}") from None
    d.same_set("KEYS", "*")
    for key in KEYS:
        d.same("GET", key)
        d.same("OBJECT", "ENCODING", key)
        d.close("PTTL", key, tolerance=1500)
