//! Recording and reporting: latency histograms (HdrHistogram), a
//! per-second timeline, the client's own CPU time, the table, `--json` and
//! `--plot`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value as Json};

/// Latency histogram in nanoseconds (1 ns .. 100 s, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds")
}

/// What one worker measured; merged at the end.
pub struct Recorder {
    /// Latencies by operation name.
    pub latency: BTreeMap<&'static str, Histogram<u64>>,
    /// Counters by name (ops, hits, bytes, failures...).
    pub counts: BTreeMap<&'static str, u64>,
    /// Units of work (kv operations, trace requests, hand-offs) completed
    /// in each second since the start; the last entry covers a part second.
    pub timeline: Vec<u64>,
    /// Counters kept per second as well ([`Recorder::tally`]).
    pub series: BTreeMap<&'static str, Vec<u64>>,
    /// When the last worker merged its recorder into this one: the end of
    /// the measured run (the caller may notice it only later).
    pub finished: Option<Instant>,
    start: Instant,
}

impl Recorder {
    /// An empty recorder whose timeline starts at `start`.
    pub fn new(start: Instant) -> Recorder {
        Recorder {
            latency: BTreeMap::new(),
            counts: BTreeMap::new(),
            timeline: Vec::new(),
            series: BTreeMap::new(),
            finished: None,
            start,
        }
    }

    /// Records one completed unit of work (a request, a hand-off) of kind
    /// `op` that took `took`: its latency, and one completion in the
    /// throughput timeline.
    pub fn op(&mut self, op: &'static str, took: Duration) {
        self.latency(op, took);
        let second = self.start.elapsed().as_secs() as usize;
        if self.timeline.len() <= second {
            self.timeline.resize(second + 1, 0);
        }
        self.timeline[second] += 1;
    }

    /// Records the latency of a step of a unit of work (a lookup inside a
    /// request) without counting it in the throughput timeline.
    pub fn latency(&mut self, op: &'static str, took: Duration) {
        let h = self.latency.entry(op).or_insert_with(histogram);
        let _ = h.record(took.as_nanos().max(1) as u64);
    }

    /// Adds `n` to counter `name`.
    pub fn add(&mut self, name: &'static str, n: u64) {
        *self.counts.entry(name).or_insert(0) += n;
        if PROBLEMS.contains(&name) {
            PROBLEMS_SEEN.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Adds `n` to counter `name` and to its count for this second (the
    /// hit rate over time of a run whose cluster changes midway).
    pub fn tally(&mut self, name: &'static str, n: u64) {
        self.add(name, n);
        let second = self.start.elapsed().as_secs() as usize;
        let series = self.series.entry(name).or_default();
        if series.len() <= second {
            series.resize(second + 1, 0);
        }
        series[second] += n;
    }

    /// Folds `other` into this one (a worker does it the moment it is done).
    pub fn merge(&mut self, other: Recorder) {
        let now = Instant::now();
        self.finished = Some(self.finished.map_or(now, |f| f.max(now)));
        for (op, h) in other.latency {
            let mine = self.latency.entry(op).or_insert_with(histogram);
            let _ = mine.add(&h);
        }
        for (k, v) in other.counts {
            *self.counts.entry(k).or_insert(0) += v;
        }
        if self.timeline.len() < other.timeline.len() {
            self.timeline.resize(other.timeline.len(), 0);
        }
        for (i, v) in other.timeline.into_iter().enumerate() {
            self.timeline[i] += v;
        }
        for (name, theirs) in other.series {
            let mine = self.series.entry(name).or_default();
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            for (i, v) in theirs.into_iter().enumerate() {
                mine[i] += v;
            }
        }
    }

    /// Wall time of the run: from `start` to the last worker's merge.
    pub fn wall(&self) -> Duration {
        self.finished
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(self.start)
    }

    /// Counter value (0 if never counted).
    pub fn count(&self, name: &str) -> u64 {
        self.counts.get(name).copied().unwrap_or(0)
    }
}

/// A recorder shared by the workers of one run.
pub type Shared = Arc<Mutex<Recorder>>;

/// Percentiles of a histogram in microseconds.
pub fn percentiles(h: &Histogram<u64>) -> Json {
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    json!({
        "count": h.len(),
        "mean_us": h.mean() / 1000.0,
        "p50_us": us(0.5),
        "p90_us": us(0.9),
        "p99_us": us(0.99),
        "p999_us": us(0.999),
        "max_us": h.max() as f64 / 1000.0,
    })
}

/// This process's CPU time so far (user, system).
pub fn cpu_time() -> (Duration, Duration) {
    // SAFETY: getrusage fills the zeroed struct we own.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return (Duration::ZERO, Duration::ZERO);
        }
        let d = |tv: libc::timeval| {
            Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64)
        };
        (d(usage.ru_utime), d(usage.ru_stime))
    }
}

/// The end of a run: waits for its tasks in order (the first error is the
/// run's), closes the progress bar and takes the recorder back, with the
/// run's wall time (to the last worker's merge, not to when the caller,
/// polling the bar every 200 ms, noticed) and the client's CPU over it
/// ([`client_cpu`]).
pub async fn finish_run(
    tasks: impl IntoIterator<Item = tokio::task::JoinHandle<std::io::Result<()>>>,
    bar: &Progress,
    shared: Arc<Mutex<Recorder>>,
    cpu_before: (Duration, Duration),
    client_threads: usize,
) -> std::io::Result<(Recorder, Duration, Json)> {
    for t in tasks {
        t.await.map_err(std::io::Error::other)??;
    }
    bar.finish();
    let rec = Arc::try_unwrap(shared)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .ok_or_else(|| std::io::Error::other("recorder still shared"))?;
    let wall = rec.wall();
    let cpu = client_cpu(cpu_before, wall, client_threads);
    Ok((rec, wall, cpu))
}

/// CPU the client used during a run, to tell when the client is the limit.
/// The client can use at most `threads` cores, and no more than the
/// machine has; past 90% of that it is saturated and the run measured the
/// client, not the server.
pub fn client_cpu(before: (Duration, Duration), wall: Duration, threads: usize) -> Json {
    let (user0, sys0) = before;
    let (user1, sys1) = cpu_time();
    let total = (user1 - user0) + (sys1 - sys0);
    let busy = total.as_secs_f64() / wall.as_secs_f64().max(1e-9);
    let machine = std::thread::available_parallelism().map_or(1, |n| n.get());
    let usable = threads.min(machine).max(1);
    json!({
        "user_s": (user1 - user0).as_secs_f64(),
        "sys_s": (sys1 - sys0).as_secs_f64(),
        "cores_busy": busy,
        "threads": threads,
        "machine_cores": machine,
        "saturated": busy > usable as f64 * 0.9,
    })
}

/// Prints the client's CPU line of a run (from [`client_cpu`]).
pub fn print_client_cpu(cpu: &Json) {
    println!(
        "client CPU: {:.2} cores busy of {} threads on {} cores{}",
        cpu["cores_busy"].as_f64().unwrap_or(0.0),
        cpu["threads"],
        cpu["machine_cores"],
        if cpu["saturated"].as_bool() == Some(true) {
            " (client saturated: numbers are a lower bound)"
        } else {
            ""
        }
    );
}

/// Prints the latency table of a run.
pub fn print_latency_table(rec: &Recorder) {
    println!("| op | count | p50 µs | p99 µs | p99.9 µs | max µs |");
    println!("|---|---|---|---|---|---|");
    for (op, h) in &rec.latency {
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "| {op} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            h.len(),
            us(0.5),
            us(0.99),
            us(0.999),
            h.max() as f64 / 1000.0
        );
    }
}

/// Writes the JSON report.
pub fn write_json(path: &Path, report: &Json) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(path, text + "\n")
}

/// Draws the latency CDFs (top) and the throughput over time (bottom).
pub fn plot(path: &Path, title: &str, rec: &Recorder) -> Result<(), String> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (top, bottom) = root.split_vertically(420);
    let max_us = rec
        .latency
        .values()
        .map(|h| h.value_at_quantile(0.9999) as f64 / 1000.0)
        .fold(1.0, f64::max);
    let mut cdf = ChartBuilder::on(&top)
        .caption(format!("{title}: latency CDF"), ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d((1.0f64..max_us * 1.1).log_scale(), 0.0f64..100.0)
        .map_err(|e| e.to_string())?;
    cdf.configure_mesh()
        .x_desc("latency (µs)")
        .y_desc("percentile")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (op, h)) in rec.latency.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = h
            .iter_quantiles(4)
            .map(|v| {
                (
                    (v.value_iterated_to() as f64 / 1000.0).max(1.0),
                    v.quantile_iterated_to() * 100.0,
                )
            })
            .collect();
        cdf.draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(*op)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    cdf.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| e.to_string())?;
    let max_ops = rec.timeline.iter().copied().max().unwrap_or(1).max(1) as f64;
    let mut tput = ChartBuilder::on(&bottom)
        .caption("throughput over time", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(
            0f64..(rec.timeline.len().max(1)) as f64,
            0f64..max_ops * 1.1,
        )
        .map_err(|e| e.to_string())?;
    tput.configure_mesh()
        .x_desc("seconds")
        .y_desc("ops/s")
        .draw()
        .map_err(|e| e.to_string())?;
    tput.draw_series(LineSeries::new(
        rec.timeline
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as f64 + 0.5, v as f64)),
        BLUE.stroke_width(2),
    ))
    .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Counters that say something went wrong: the progress line shows their
/// sum while the run goes on (workers merge their recorders only at the end).
const PROBLEMS: [&str; 3] = ["errors", "verify_failures", "timeouts"];
static PROBLEMS_SEEN: AtomicU64 = AtomicU64::new(0);

/// How often a run's progress is printed as a line when stderr is not a
/// terminal (a log, CI).
const LINE_EVERY: Duration = Duration::from_secs(5);

/// Progress of a run expected to last more than a few seconds, on stderr:
/// a bar with the rate and the errors so far on a terminal, else a line
/// every [`LINE_EVERY`] (count, rate, errors), so a log shows a run moving.
pub struct Progress {
    bar: indicatif::ProgressBar,
    /// What one unit of work is called (`ops`, `requests`, `hand-offs`).
    unit: &'static str,
    /// Units done, when the bar's position is something else (seconds).
    done: AtomicU64,
    start: Instant,
    /// Lines instead of a bar, and when the last was printed.
    lines: Option<Mutex<Instant>>,
}

impl Progress {
    /// A bar of `length` steps for work of `unit`s; silent when the run
    /// should be over in under three seconds.
    pub fn new(unit: &'static str, length: u64, seconds_expected: f64) -> Arc<Progress> {
        use std::io::IsTerminal;
        let now = Instant::now();
        let shown = seconds_expected >= 3.0;
        let terminal = std::io::stderr().is_terminal();
        let bar = if shown && terminal {
            let bar = indicatif::ProgressBar::new(length);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}",
            ) {
                bar.set_style(style);
            }
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Arc::new(Progress {
            bar,
            unit,
            done: AtomicU64::new(0),
            start: now,
            lines: (shown && !terminal).then(|| Mutex::new(now)),
        })
    }

    /// Moves the bar to `pos`, with `done` units of work finished.
    pub fn set(&self, pos: u64, done: u64) {
        self.bar.set_position(pos);
        self.done.store(done, Ordering::Relaxed);
        self.tick();
    }

    /// Counts `n` more units done (the bar counts units).
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
        self.done.fetch_add(n, Ordering::Relaxed);
        self.tick();
    }

    /// The rate and errors so far, as the bar's message or a line when due.
    fn tick(&self) {
        let secs = self.start.elapsed().as_secs_f64();
        let done = self.done.load(Ordering::Relaxed);
        let rate = done as f64 / secs.max(1e-3);
        let problems = PROBLEMS_SEEN.load(Ordering::Relaxed);
        let text = format!("{done} {}, {rate:.0}/s, {problems} errors", self.unit);
        match &self.lines {
            None => self.bar.set_message(text),
            Some(last) => {
                let Ok(mut last) = last.lock() else { return };
                if last.elapsed() >= LINE_EVERY {
                    *last = Instant::now();
                    eprintln!("progress: {secs:.0} s, {text}");
                }
            }
        }
    }

    /// Clears the bar (nothing to clear for lines).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
