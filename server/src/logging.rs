//! The server's log: tracing events on stderr, as text (coloured only when
//! stderr is a terminal, so a redirected log holds no escape codes) or as one
//! JSON object per line for log pipelines, at a level named as Redis names
//! it and changed at run time by `CONFIG SET loglevel`.

use std::fmt::{self, Write as _};
use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{reload, Registry};

/// `--log-format`: how each event is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `TIME LEVEL target: message field=value`.
    Text,
    /// `{"time":…,"level":…,"target":…,"message":…,"fields":{…}}`.
    Json,
}

/// Redis's level names, most verbose first (`--loglevel`, `CONFIG SET loglevel`).
pub const LEVELS: [&str; 5] = ["debug", "verbose", "notice", "warning", "nothing"];

/// The filter a Redis level name stands for.
pub fn level_filter(name: &str) -> Option<LevelFilter> {
    Some(match name.to_ascii_lowercase().as_str() {
        "debug" => LevelFilter::TRACE,
        "verbose" => LevelFilter::DEBUG,
        "notice" => LevelFilter::INFO,
        "warning" => LevelFilter::WARN,
        "nothing" => LevelFilter::OFF,
        _ => return None,
    })
}

/// The running log's level, once [`init`] installed it.
static LEVEL: OnceLock<reload::Handle<LevelFilter, Registry>> = OnceLock::new();

/// Installs the log (once per process; later calls change nothing).
pub fn init(level: &str, format: LogFormat) {
    let (filter, handle) = reload::Layer::new(level_filter(level).unwrap_or(LevelFilter::INFO));
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => Registry::default()
            .with(filter)
            .with(layer.with_ansi(std::io::stderr().is_terminal()))
            .try_init(),
        LogFormat::Json => Registry::default()
            .with(filter)
            .with(layer.with_ansi(false).event_format(Json))
            .try_init(),
    };
    if installed.is_ok() {
        let _ = LEVEL.set(handle);
    }
}

/// Changes the running log's level (`CONFIG SET loglevel`); false for a
/// name that is not a level or before [`init`].
pub fn set_level(name: &str) -> bool {
    match (LEVEL.get(), level_filter(name)) {
        (Some(handle), Some(filter)) => handle.modify(|level| *level = filter).is_ok(),
        _ => false,
    }
}

/// The line on stdout that names the listening address (scripts using
/// `--port 0` read it): `kvtier listening on ADDR`, or with `--log-format
/// json` a log object with that message, so a log pipeline reading stdout
/// and stderr together sees only JSON.
pub fn port_line(addr: &str, format: LogFormat) -> String {
    let message = format!("kvtier listening on {addr}");
    match format {
        LogFormat::Text => message,
        LogFormat::Json => {
            let mut fields = String::from("\"addr\":");
            let _ = json_string(&mut fields, addr);
            let mut line = String::new();
            let _ = json_line(&mut line, "INFO", "kvtier_server", &message, &fields);
            line
        }
    }
}

/// One log object, stamped now: `time` (RFC 3339, UTC), `level`, `target`,
/// `message`, and `fields` (given as JSON members, `"name":value,…`).
fn json_line(
    out: &mut impl fmt::Write,
    level: &str,
    target: &str,
    message: &str,
    fields: &str,
) -> fmt::Result {
    let mut time = String::new();
    SystemTime.format_time(&mut Writer::new(&mut time))?;
    out.write_str("{\"time\":")?;
    json_string(out, &time)?;
    write!(out, ",\"level\":\"{level}\",\"target\":")?;
    json_string(out, target)?;
    out.write_str(",\"message\":")?;
    json_string(out, message)?;
    write!(out, ",\"fields\":{{{fields}}}}}")
}

/// One JSON object per event ([`json_line`]): numbers and booleans among
/// the fields as such, anything else as its text.
struct Json;

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut out: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = JsonFields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        json_line(
            &mut out,
            meta.level().as_str(),
            meta.target(),
            &fields.message,
            &fields.rest,
        )?;
        writeln!(out)
    }
}

/// An event's fields: its message apart, the others as `"name":value,…`.
#[derive(Default)]
struct JsonFields {
    message: String,
    rest: String,
}

impl JsonFields {
    fn key(&mut self, field: &Field) {
        if !self.rest.is_empty() {
            self.rest.push(',');
        }
        let _ = json_string(&mut self.rest, field.name());
        self.rest.push(':');
    }

    fn text(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.key(field);
            let _ = json_string(&mut self.rest, value);
        }
    }

    fn raw(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        self.key(field);
        let _ = self.rest.write_fmt(value);
    }
}

impl Visit for JsonFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.raw(field, format_args!("{value}"));
        } else {
            self.text(field, &value.to_string());
        }
    }
}

/// `s` as a JSON string: quotes, backslashes and control characters escaped.
fn json_string(out: &mut impl fmt::Write, s: &str) -> fmt::Result {
    out.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => out.write_str("\\\"")?,
            '\\' => out.write_str("\\\\")?,
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32)?,
            c => out.write_char(c)?,
        }
    }
    out.write_char('"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped() {
        let mut s = String::new();
        json_string(&mut s, "a\"b\\c\nd\u{1b}[2m é").unwrap();
        assert_eq!(s, "\"a\\\"b\\\\c\\nd\\u001b[2m é\"");
    }

    #[test]
    fn the_port_line_is_json_in_json_mode() {
        assert_eq!(
            port_line("127.0.0.1:6379", LogFormat::Text),
            "kvtier listening on 127.0.0.1:6379"
        );
        let line = port_line("127.0.0.1:6379", LogFormat::Json);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["message"], "kvtier listening on 127.0.0.1:6379");
        assert_eq!(v["fields"]["addr"], "127.0.0.1:6379");
        assert_eq!(v["level"], "INFO");
    }

    #[test]
    fn redis_level_names() {
        assert_eq!(level_filter("NOTICE"), Some(LevelFilter::INFO));
        assert_eq!(level_filter("warning"), Some(LevelFilter::WARN));
        assert_eq!(level_filter("nothing"), Some(LevelFilter::OFF));
        assert_eq!(level_filter("info"), None);
        assert!(LEVELS.iter().all(|l| level_filter(l).is_some()));
    }
}
