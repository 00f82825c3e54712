//! COMMAND INFO and COMMAND DOCS replies, built from the command table.
//!
//! Each command declares its arguments as one syntax line, close to the way
//! Redis documents commands, and this module turns it into the nested
//! argument maps of COMMAND DOCS (which redis-cli uses for its hints):
//!
//! ```text
//! WORD            a pure token                 ("NX")
//! name[:type]     an argument; type from the name or explicit ("key", "seconds", "increment:double")
//! [ ... ]         optional;  ( ... ) grouped;  a|b  one of
//! TOKEN arg       an argument introduced by a token ("EX seconds")
//! item...         may repeat
//! ```

use kvtier_protocol::Reply;

use super::{flags, CommandSpec, KeySpec};

/// One documented argument (COMMAND DOCS `arguments` entry).
#[derive(Debug, Clone, PartialEq)]
pub struct ArgDoc {
    /// Argument name.
    pub name: String,
    /// `key`, `string`, `integer`, `double`, `pattern`, `unix-time`,
    /// `pure-token`, `oneof` or `block`.
    pub kind: &'static str,
    /// The token that introduces it, if any.
    pub token: Option<String>,
    /// May be left out.
    pub optional: bool,
    /// May repeat.
    pub multiple: bool,
    /// Members of a `oneof` or `block`.
    pub children: Vec<ArgDoc>,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Open(char),
    Close(char),
    Pipe,
    Word(String),
    Repeat,
}

fn tokenize(syntax: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut Vec<Tok>| {
        if word.is_empty() {
            return;
        }
        if let Some(base) = word.strip_suffix("...") {
            if !base.is_empty() {
                out.push(Tok::Word(base.to_string()));
            }
            out.push(Tok::Repeat);
        } else {
            out.push(Tok::Word(word.clone()));
        }
        word.clear();
    };
    for c in syntax.chars() {
        match c {
            '[' | '(' => {
                flush(&mut word, &mut out);
                out.push(Tok::Open(c));
            }
            ']' | ')' => {
                flush(&mut word, &mut out);
                out.push(Tok::Close(c));
            }
            '|' => {
                flush(&mut word, &mut out);
                out.push(Tok::Pipe);
            }
            c if c.is_whitespace() => flush(&mut word, &mut out),
            c => word.push(c),
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Parses a syntax line into argument docs.
pub fn parse_syntax(syntax: &str) -> Result<Vec<ArgDoc>, String> {
    let toks = tokenize(syntax);
    let mut pos = 0;
    let alts = parse_alternatives(&toks, &mut pos)?;
    if pos != toks.len() {
        return Err(format!("unexpected {:?} in {syntax:?}", toks[pos]));
    }
    if alts.len() == 1 {
        Ok(alts.into_iter().next().unwrap_or_default())
    } else {
        // `a|b` at the top: one required choice.
        Ok(vec![group_arg(alts)])
    }
}

fn parse_alternatives(toks: &[Tok], pos: &mut usize) -> Result<Vec<Vec<ArgDoc>>, String> {
    let mut alts = vec![parse_sequence(toks, pos)?];
    while *pos < toks.len() && toks[*pos] == Tok::Pipe {
        *pos += 1;
        alts.push(parse_sequence(toks, pos)?);
    }
    Ok(alts)
}

fn parse_sequence(toks: &[Tok], pos: &mut usize) -> Result<Vec<ArgDoc>, String> {
    let mut seq: Vec<ArgDoc> = Vec::new();
    while *pos < toks.len() {
        let mut item = match &toks[*pos] {
            Tok::Pipe | Tok::Close(_) => break,
            Tok::Repeat => return Err("'...' without an item".into()),
            Tok::Word(w) => {
                *pos += 1;
                word_arg(w)
            }
            Tok::Open(open) => {
                let open = *open;
                *pos += 1;
                let alts = parse_alternatives(toks, pos)?;
                let close = if open == '[' { ']' } else { ')' };
                if toks.get(*pos) != Some(&Tok::Close(close)) {
                    return Err(format!("missing '{close}'"));
                }
                *pos += 1;
                let mut group = group_arg(alts);
                group.optional = open == '[';
                group
            }
        };
        if toks.get(*pos) == Some(&Tok::Repeat) {
            *pos += 1;
            item.multiple = true;
        }
        // `TOKEN arg` becomes one argument introduced by the token.
        let merge = matches!(seq.last(), Some(prev) if prev.kind == "pure-token"
            && !prev.optional && !prev.multiple && item.token.is_none() && item.kind != "pure-token");
        if merge {
            let token = seq.pop().and_then(|t| t.token);
            item.token = token;
        }
        seq.push(item);
    }
    Ok(seq)
}

/// A group of alternatives as one argument: a `oneof` when there are several,
/// the single member when it is alone, a `block` for a sequence.
fn group_arg(alts: Vec<Vec<ArgDoc>>) -> ArgDoc {
    let mut members: Vec<ArgDoc> = alts.into_iter().map(sequence_arg).collect();
    if members.len() == 1 {
        return members.pop().unwrap_or_else(|| block(Vec::new()));
    }
    let name = members
        .iter()
        .map(|m| m.name.clone())
        .collect::<Vec<_>>()
        .join("-");
    ArgDoc {
        name: if name.len() > 40 {
            "option".into()
        } else {
            name
        },
        kind: "oneof",
        token: None,
        optional: false,
        multiple: false,
        children: members,
    }
}

fn sequence_arg(mut seq: Vec<ArgDoc>) -> ArgDoc {
    if seq.len() == 1 {
        seq.pop().unwrap_or_else(|| block(Vec::new()))
    } else {
        block(seq)
    }
}

fn block(children: Vec<ArgDoc>) -> ArgDoc {
    let name = children
        .iter()
        .map(|c| c.name.clone())
        .collect::<Vec<_>>()
        .join("-");
    ArgDoc {
        name: if name.is_empty() {
            "block".into()
        } else {
            name
        },
        kind: "block",
        token: None,
        optional: false,
        multiple: false,
        children,
    }
}

fn word_arg(w: &str) -> ArgDoc {
    let is_token = w
        .chars()
        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && w.chars().any(|c| c.is_ascii_uppercase());
    if is_token {
        return ArgDoc {
            name: w.to_ascii_lowercase(),
            kind: "pure-token",
            token: Some(w.to_string()),
            optional: false,
            multiple: false,
            children: Vec::new(),
        };
    }
    let (name, kind) = match w.split_once(':') {
        Some((name, "integer")) => (name, "integer"),
        Some((name, "double")) => (name, "double"),
        Some((name, "string")) => (name, "string"),
        Some((name, _)) => (name, "string"),
        None => (w, infer_kind(w)),
    };
    ArgDoc {
        name: name.to_string(),
        kind,
        token: None,
        optional: false,
        multiple: false,
        children: Vec::new(),
    }
}

fn infer_kind(name: &str) -> &'static str {
    const INTEGERS: [&str; 17] = [
        "seconds",
        "milliseconds",
        "count",
        "numkeys",
        "numblocks",
        "offset",
        "start",
        "end",
        "index",
        "timeout",
        "increment",
        "decrement",
        "numreplicas",
        "protover",
        "db",
        "client-id",
        "max-age",
    ];
    match name {
        "key" | "source" | "destination" | "newkey" | "parentkey" => "key",
        "pattern" => "pattern",
        n if n.starts_with("unix-time") => "unix-time",
        n if INTEGERS.contains(&n) => "integer",
        _ => "string",
    }
}

fn arg_reply(arg: &ArgDoc) -> Reply {
    let mut fields = vec![
        (Reply::bulk("name"), Reply::bulk(&arg.name)),
        (Reply::bulk("type"), Reply::bulk(arg.kind)),
    ];
    if arg.kind == "key" {
        fields.push((Reply::bulk("key_spec_index"), Reply::Int(0)));
    }
    if let Some(token) = &arg.token {
        fields.push((Reply::bulk("token"), Reply::bulk(token)));
    }
    let mut arg_flags = Vec::new();
    if arg.optional {
        arg_flags.push(Reply::status("optional"));
    }
    if arg.multiple {
        arg_flags.push(Reply::status("multiple"));
    }
    if !arg_flags.is_empty() {
        fields.push((Reply::bulk("flags"), Reply::Array(arg_flags)));
    }
    if !arg.children.is_empty() {
        fields.push((
            Reply::bulk("arguments"),
            Reply::Array(arg.children.iter().map(arg_reply).collect()),
        ));
    }
    Reply::Map(fields)
}

/// The COMMAND DOCS entry of one command: its name and documentation map.
pub fn docs_reply(spec: &CommandSpec) -> (Reply, Reply) {
    let mut fields = vec![
        (Reply::bulk("summary"), Reply::bulk(spec.summary)),
        (Reply::bulk("since"), Reply::bulk(spec.since)),
        (Reply::bulk("group"), Reply::bulk(spec.group)),
        (Reply::bulk("complexity"), Reply::bulk(spec.complexity)),
    ];
    let args = parse_syntax(spec.syntax).unwrap_or_default();
    if !args.is_empty() {
        fields.push((
            Reply::bulk("arguments"),
            Reply::Array(args.iter().map(arg_reply).collect()),
        ));
    }
    if !spec.subcommands.is_empty() {
        fields.push((
            Reply::bulk("subcommands"),
            Reply::Map(spec.subcommands.iter().map(docs_reply).collect()),
        ));
    }
    (Reply::bulk(spec.name), Reply::Map(fields))
}

/// ACL categories, derived from the group and flags as Redis assigns them.
pub fn acl_categories(spec: &CommandSpec) -> Vec<&'static str> {
    let mut cats = Vec::new();
    if spec.has(flags::WRITE) {
        cats.push("@write");
    }
    if spec.has(flags::READONLY) {
        cats.push("@read");
    }
    match spec.group {
        "string" => cats.push("@string"),
        "generic" => cats.push("@keyspace"),
        "connection" => cats.push("@connection"),
        "server" => cats.push("@admin"),
        // The block dialect: strings, and a category of its own so an ACL
        // can grant (or deny) the dialect as a whole.
        "block" => {
            cats.push("@string");
            cats.push("@kvblock");
        }
        _ => {}
    }
    if spec.has(flags::DANGEROUS) || spec.has(flags::ADMIN) {
        cats.push("@dangerous");
    }
    if spec.has(flags::FAST) {
        cats.push("@fast");
    } else {
        cats.push("@slow");
    }
    if spec.has(flags::BLOCKING) {
        cats.push("@blocking");
    }
    cats
}

/// The key-spec flags of a command's keys, as COMMAND INFO and COMMAND
/// GETKEYSANDFLAGS report them. Redis spells the access type in capitals
/// and the operation in lower case (`RO access`, `RW update`).
pub fn key_spec_flags(spec: &CommandSpec) -> &'static [&'static str] {
    if spec.has(flags::WRITE) {
        &["RW", "update"]
    } else {
        &["RO", "access"]
    }
}

fn key_specs_reply(spec: &CommandSpec) -> Reply {
    let KeySpec {
        first,
        last,
        step,
        count_at,
    } = spec.keys;
    if first <= 0 {
        return Reply::Array(Vec::new());
    }
    let access = key_spec_flags(spec);
    let map = |pairs: Vec<(&str, Reply)>| {
        Reply::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Reply::bulk(k), v))
                .collect(),
        )
    };
    let begin_index = if count_at > 0 { count_at } else { first };
    let find_keys = if count_at > 0 {
        map(vec![
            ("type", Reply::bulk("keynum")),
            (
                "spec",
                map(vec![
                    ("keynumidx", Reply::Int(0)),
                    ("firstkey", Reply::Int(1)),
                    ("keystep", Reply::Int(step.max(1) as i64)),
                ]),
            ),
        ])
    } else {
        let last_key = if last < 0 {
            last as i64
        } else {
            (last - first) as i64
        };
        map(vec![
            ("type", Reply::bulk("range")),
            (
                "spec",
                map(vec![
                    ("lastkey", Reply::Int(last_key)),
                    ("keystep", Reply::Int(step.max(1) as i64)),
                    ("limit", Reply::Int(0)),
                ]),
            ),
        ])
    };
    Reply::Array(vec![map(vec![
        (
            "flags",
            Reply::Set(access.iter().map(|f| Reply::status(f)).collect()),
        ),
        (
            "begin_search",
            map(vec![
                ("type", Reply::bulk("index")),
                ("spec", map(vec![("index", Reply::Int(begin_index as i64))])),
            ]),
        ),
        ("find_keys", find_keys),
    ])])
}

/// The COMMAND INFO entry of one command (Redis 7's ten fields).
pub fn info_reply(spec: &CommandSpec) -> Reply {
    let mut flag_names: Vec<Reply> = flags::NAMES
        .iter()
        .filter(|(bit, _)| spec.has(*bit))
        .map(|(_, name)| Reply::status(name))
        .collect();
    // Movable keys have no fixed (first, last, step); clients ask GETKEYS.
    let (first, last, step) = if spec.keys.movable() {
        flag_names.push(Reply::status("movablekeys"));
        (0, 0, 0)
    } else {
        (spec.keys.first, spec.keys.last, spec.keys.step)
    };
    Reply::Array(vec![
        Reply::bulk(spec.name),
        Reply::Int(spec.arity as i64),
        Reply::Set(flag_names),
        Reply::Int(first as i64),
        Reply::Int(last as i64),
        Reply::Int(step as i64),
        Reply::Set(
            acl_categories(spec)
                .into_iter()
                .map(Reply::status)
                .collect(),
        ),
        Reply::Array(Vec::new()),
        key_specs_reply(spec),
        Reply::Array(spec.subcommands.iter().map(info_reply).collect()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_syntax() {
        let args = parse_syntax(
            "key value [NX|XX] [GET] [EX seconds|PX milliseconds|EXAT unix-time-seconds|PXAT unix-time-milliseconds|KEEPTTL]",
        )
        .unwrap();
        assert_eq!(args.len(), 5);
        assert_eq!((args[0].name.as_str(), args[0].kind), ("key", "key"));
        assert_eq!(args[2].kind, "oneof");
        assert!(args[2].optional);
        assert_eq!(args[3].kind, "pure-token");
        let expiry = &args[4];
        assert_eq!(expiry.children.len(), 5);
        assert_eq!(expiry.children[0].name, "seconds");
        assert_eq!(expiry.children[0].kind, "integer");
        assert_eq!(expiry.children[0].token.as_deref(), Some("EX"));
        assert_eq!(expiry.children[2].kind, "unix-time");
        assert_eq!(expiry.children[4].kind, "pure-token");
    }

    #[test]
    fn repeats_blocks_and_tokens() {
        let args = parse_syntax("(key value)...").unwrap();
        assert_eq!(args[0].kind, "block");
        assert!(args[0].multiple);
        let args = parse_syntax("key...").unwrap();
        assert!(args[0].multiple);
        let args = parse_syntax("cursor [MATCH pattern] [COUNT count] [TYPE type]").unwrap();
        assert_eq!(args[1].token.as_deref(), Some("MATCH"));
        assert!(args[1].optional);
        let args = parse_syntax("[FILTERBY (MODULE module-name|ACLCAT category|PATTERN pattern)]")
            .unwrap();
        assert_eq!(args[0].token.as_deref(), Some("FILTERBY"));
        assert_eq!(args[0].kind, "oneof");
        assert!(parse_syntax("[a").is_err());
        assert_eq!(parse_syntax("a | b").unwrap()[0].kind, "oneof");
        assert!(parse_syntax("a)").is_err());
        assert!(parse_syntax("").unwrap().is_empty());
    }
}
