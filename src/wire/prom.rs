//! Prometheus text exposition format (version 0.0.4, and the sample lines of OpenMetrics): text →
//! samples `(name, labels, value)`, and [`PromWriter`], the writer of the mock's and the
//! recorder's `/metrics`.
//!
//! What a scraper of vLLM/SGLang/llama.cpp `/metrics` needs, exactly: `# HELP` / `# TYPE` / other comments
//! and blank lines are skipped; a sample line is `name[{label="value",...}] value [timestamp]`
//! with names `[a-zA-Z_:][a-zA-Z0-9_:]*`, label values with the escapes `\\`, `\"`, `\n`, an
//! optional trailing comma in the label set, values as Go's `ParseFloat` reads them (`+Inf`,
//! `-Inf`, `NaN`, exponents), an optional integer timestamp, and an OpenMetrics exemplar
//! (` # {...} v`) ignored. CRLF line ends are tolerated. A malformed line never fails the whole
//! scrape: it is reported with its 1-based line number and skipped (one odd metric must not hide
//! the others). Pure: no I/O; it does not check that a family's `# TYPE` matches its samples, and
//! does not interpret histograms or summaries beyond their plain sample lines.

use std::fmt::{self, Display, Write as _};

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PromSample {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
    /// Milliseconds since the epoch, when the line carries one.
    pub(crate) timestamp_ms: Option<i64>,
}

impl PromSample {
    /// The value of label `k`.
    pub(crate) fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

/// A parsed exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Parsed {
    pub(crate) samples: Vec<PromSample>,
    /// Skipped lines: (1-based line number, what was wrong).
    pub(crate) bad_lines: Vec<(usize, String)>,
}

impl Parsed {
    /// Samples named `name` (all label sets).
    pub(crate) fn family<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a PromSample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// Sum of `name` over its label sets (e.g. over data-parallel engines); `None` when absent.
    pub(crate) fn sum(&self, name: &str) -> Option<f64> {
        let mut it = self.family(name).peekable();
        it.peek()?;
        Some(it.map(|s| s.value).sum())
    }

    /// Mean of `name` over its label sets (for ratios such as KV-cache usage); `None` when absent.
    pub(crate) fn mean(&self, name: &str) -> Option<f64> {
        let (n, s) = self
            .family(name)
            .fold((0usize, 0.0), |(n, s), x| (n + 1, s + x.value));
        (n > 0).then(|| s / n as f64)
    }
}

/// Parses an exposition; malformed lines are skipped and listed.
pub(crate) fn parse(text: &str) -> Parsed {
    let mut out = Parsed::default();
    for (i, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw).trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Ok(s) => out.samples.push(s),
            Err(e) => out.bad_lines.push((i + 1, e)),
        }
    }
    out
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Splits a leading metric/label name off `s`.
fn take_name(s: &str, colons: bool) -> Option<(&str, &str)> {
    let mut chars = s.char_indices();
    match chars.next() {
        Some((_, c)) if is_name_start(c) && (colons || c != ':') => {}
        _ => return None,
    }
    let end = chars
        .find(|&(_, c)| !(is_name_char(c) && (colons || c != ':')))
        .map_or(s.len(), |(i, _)| i);
    Some((&s[..end], &s[end..]))
}

fn parse_line(line: &str) -> Result<PromSample, String> {
    let (name, mut rest) =
        take_name(line, true).ok_or_else(|| format!("no metric name at {:?}", clip(line)))?;
    let mut labels = Vec::new();
    let spaced = rest.trim_start_matches([' ', '\t']);
    if let Some(r) = spaced.strip_prefix('{') {
        rest = r;
        loop {
            rest = rest.trim_start();
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let (k, r) = take_name(rest, false)
                .ok_or_else(|| format!("{name}: bad label name at {:?}", clip(rest)))?;
            let r = r.trim_start();
            let r = r
                .strip_prefix('=')
                .ok_or_else(|| format!("{name}: label {k} has no '='"))?;
            let r = r.trim_start();
            let r = r
                .strip_prefix('"')
                .ok_or_else(|| format!("{name}: label {k}'s value is not quoted"))?;
            let (v, r) = unescape_until_quote(r)
                .ok_or_else(|| format!("{name}: label {k}'s value is not terminated"))?;
            labels.push((k.to_string(), v));
            rest = r.trim_start();
            if let Some(r) = rest.strip_prefix(',') {
                rest = r;
            } else if !rest.starts_with('}') {
                return Err(format!("{name}: expected ',' or '}}' after label {k}"));
            }
        }
    }
    if labels.is_empty() && !rest.starts_with([' ', '\t', '}']) {
        return Err(format!("{name}: no value"));
    }
    let rest = rest.strip_prefix('}').unwrap_or(rest);
    let mut fields = rest.split_ascii_whitespace();
    let v = fields.next().ok_or_else(|| format!("{name}: no value"))?;
    let value = parse_value(v).ok_or_else(|| format!("{name}: value {v:?} is not a number"))?;
    let timestamp_ms = match fields.next() {
        None => None,
        Some("#") => None, // OpenMetrics exemplar follows
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| format!("{name}: timestamp {t:?} is not an integer"))?,
        ),
    };
    if timestamp_ms.is_some() {
        match fields.next() {
            None | Some("#") => {}
            Some(x) => return Err(format!("{name}: unexpected {x:?} after the timestamp")),
        }
    }
    Ok(PromSample {
        name: name.to_string(),
        labels,
        value,
        timestamp_ms,
    })
}

/// Reads an escaped label value up to its closing quote; returns the value and the rest after it.
fn unescape_until_quote(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                '\\' => out.push('\\'),
                '"' => out.push('"'),
                other => {
                    // Unknown escapes are kept as written (Prometheus' own parser does the same).
                    out.push('\\');
                    out.push(other);
                }
            },
            c => out.push(c),
        }
    }
    None
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => v.parse::<f64>().ok(),
    }
}

fn clip(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The type a family's `# TYPE` line declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// An exposition being written: per family, [`PromWriter::family`] and then its samples. Names
/// are written as given; label values are escaped (`\\`, `\"`, `\n`), help texts too (`\\`,
/// `\n`); values are written with their `Display` (the caller picks `1`, `1.0` or `+Inf`). A
/// histogram is its [`PromWriter::bucket`] lines (cumulative, the last `le="+Inf"`), its `_sum`
/// and its `_count`, in the order the caller writes them.
#[derive(Debug, Default)]
pub(crate) struct PromWriter {
    out: String,
}

impl PromWriter {
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        PromWriter {
            out: String::with_capacity(bytes),
        }
    }

    /// `# HELP name help` and `# TYPE name kind`.
    pub(crate) fn family(&mut self, name: &str, kind: Kind, help: &str) {
        self.out.push_str("# HELP ");
        self.out.push_str(name);
        self.out.push(' ');
        let _ = Escaped::help(&mut self.out).write_str(help);
        let _ = writeln!(self.out, "\n# TYPE {name} {}", kind.as_str());
    }

    /// `name{k="v",...} value`, or `name value` without labels.
    pub(crate) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.line(name, "", labels, None, &value);
    }

    /// A histogram bucket: `name_bucket{k="v",...,le="le"} count`.
    pub(crate) fn bucket(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        le: impl Display,
        count: impl Display,
    ) {
        self.line(name, "_bucket", labels, Some(&le), &count);
    }

    /// A histogram's `name_sum`.
    pub(crate) fn sum(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.line(name, "_sum", labels, None, &value);
    }

    /// A histogram's `name_count`.
    pub(crate) fn count(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.line(name, "_count", labels, None, &value);
    }

    /// The text written.
    pub(crate) fn finish(self) -> String {
        self.out
    }

    fn line(
        &mut self,
        name: &str,
        suffix: &str,
        labels: &[(&str, &str)],
        le: Option<&dyn Display>,
        value: &dyn Display,
    ) {
        let out = &mut self.out;
        out.push_str(name);
        out.push_str(suffix);
        if !labels.is_empty() || le.is_some() {
            let mut sep = '{';
            for (k, v) in labels {
                out.push(sep);
                out.push_str(k);
                out.push_str("=\"");
                let _ = Escaped::label(out).write_str(v);
                out.push('"');
                sep = ',';
            }
            if let Some(le) = le {
                out.push(sep);
                out.push_str("le=\"");
                let _ = write!(Escaped::label(out), "{le}");
                out.push('"');
            }
            out.push('}');
        }
        let _ = writeln!(out, " {value}");
    }
}

/// Writes through to a string with the text format's escapes: backslash and newline, and the
/// double quote in label values.
struct Escaped<'a> {
    out: &'a mut String,
    quote: bool,
}

impl<'a> Escaped<'a> {
    fn label(out: &'a mut String) -> Self {
        Escaped { out, quote: true }
    }

    fn help(out: &'a mut String) -> Self {
        Escaped { out, quote: false }
    }
}

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '"' if self.quote => self.out.push_str("\\\""),
                c => self.out.push(c),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_vllm_metrics_parse() {
        let text = include_str!("../../fixtures/vllm/metrics_prefix_cache_before_after.txt");
        let p = parse(text);
        // The fixture interleaves "--- before" and "request 1: ..." notes: those are bad lines,
        // every vLLM line parses.
        assert_eq!(p.samples.len(), 24);
        assert!(p.bad_lines.iter().all(|(_, m)| !m.starts_with("vllm:")));
        let last: Vec<&PromSample> = p.family("vllm:prefix_cache_hits_total").collect();
        assert_eq!(last.len(), 3);
        assert_eq!(last[2].value, 1920.0);
        assert_eq!(last[2].label("model_name"), Some("tiny-llama"));
        assert_eq!(last[2].label("engine"), Some("0"));
        let by_src: Vec<&PromSample> = p
            .family("vllm:prompt_tokens_by_source_total")
            .filter(|s| s.label("source") == Some("local_cache_hit"))
            .collect();
        assert_eq!(by_src.last().unwrap().value, 1920.0);
    }

    #[test]
    fn the_format_in_full() {
        let text = "# HELP http_requests_total The total number of HTTP requests.\n\
# TYPE http_requests_total counter\n\
http_requests_total{method=\"post\",code=\"200\"} 1027 1395066363000\n\
http_requests_total{method=\"post\",code=\"400\"}    3 1395066363000\r\n\
\n\
msdos_file_access_time_seconds{path=\"C:\\\\DIR\\\\FILE.TXT\",error=\"Cannot find file:\\n\\\"FILE.TXT\\\"\"} 1.458255915e9\n\
metric_without_timestamp_and_labels 12.47\n\
something_weird{problem=\"division by zero\"} +Inf -3982045\n\
neg -Inf\n\
nan_value NaN\n\
trailing_comma{a=\"1\",} 2\n\
spaced { a = \"x\" , b=\"y\" } 5\n\
rpc_duration_seconds{quantile=\"0.99\"} 76656\n\
rpc_duration_seconds_sum 1.7560473e+07\n\
exemplar_total{a=\"b\"} 3 # {trace_id=\"x\"} 1.0\n\
  # indented comment\n\
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 4.0\n\
vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n\
vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n\
vllm:kv_cache_usage_perc{engine=\"1\"} 0.25\n\
# EOF\n";
        let p = parse(text);
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert_eq!(p.samples.len(), 16);
        let s = &p.samples[0];
        assert_eq!(s.name, "http_requests_total");
        assert_eq!(
            s.labels,
            [
                ("method".into(), "post".into()),
                ("code".into(), "200".into())
            ]
        );
        assert_eq!((s.value, s.timestamp_ms), (1027.0, Some(1395066363000)));
        assert_eq!(p.samples[1].value, 3.0);
        let ms = &p.samples[2];
        assert_eq!(ms.label("path"), Some("C:\\DIR\\FILE.TXT"));
        assert_eq!(ms.label("error"), Some("Cannot find file:\n\"FILE.TXT\""));
        assert_eq!(ms.value, 1.458255915e9);
        assert_eq!(p.samples[3].labels, []);
        assert_eq!(p.samples[4].value, f64::INFINITY);
        assert_eq!(p.samples[4].timestamp_ms, Some(-3982045));
        assert_eq!(p.samples[5].value, f64::NEG_INFINITY);
        assert!(p.samples[6].value.is_nan());
        assert_eq!(p.samples[7].label("a"), Some("1"));
        assert_eq!(p.samples[8].label("b"), Some("y"));
        assert_eq!(p.samples[10].value, 1.7560473e7);
        assert_eq!(
            (p.samples[11].value, p.samples[11].timestamp_ms),
            (3.0, None)
        );
        assert_eq!(p.sum("vllm:num_requests_running"), Some(6.0));
        assert_eq!(p.mean("vllm:kv_cache_usage_perc"), Some(0.375));
        assert_eq!(p.sum("absent"), None);
        assert_eq!(p.mean("absent"), None);
    }

    #[test]
    fn malformed_lines_are_skipped_with_their_line_number() {
        let text = "ok 1\n\
9bad 1\n\
no_value\n\
no_value_braces{a=\"b\"}\n\
unterminated{a=\"b} 1\n\
unquoted{a=b} 1\n\
not_number abc\n\
bad_ts 1 x\n\
extra 1 2 3\n\
nocomma{a=\"1\" b=\"2\"} 1\n\
glued{a=\"1\"}1\n\
ok2{x=\"y\"} 2";
        // As Prometheus' own parser, blanks between the name, the labels and the value are
        // optional after a label set: `glued{a="1"}1` is a sample.
        let p = parse(text);
        let names: Vec<&str> = p.samples.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["ok", "glued", "ok2"]);
        let lines: Vec<usize> = p.bad_lines.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert!(p.bad_lines[5].1.contains("abc"), "{:?}", p.bad_lines[5]);
    }

    #[test]
    fn never_panics_on_arbitrary_text() {
        use proptest::prelude::*;
        proptest!(|(s in "\\PC{0,200}")| {
            let p = parse(&s);
            prop_assert!(p.samples.len() + p.bad_lines.len() <= s.split('\n').count());
        });
        proptest!(|(s in "[a-z_:{}=\",\\\\ .0-9#\\n+-]{0,120}")| {
            let _ = parse(&s);
        });
    }

    /// What the mock serves parses cleanly (the mock is replay's default target).
    #[test]
    fn the_mock_exposition_parses_without_bad_lines() {
        let text = crate::mock::exposition::EngineCounters::new("mock-llama").render();
        let p = parse(&text);
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert!(p.sum("vllm:prefix_cache_hits_total").is_some());
        assert!(p.sum("vllm:num_requests_waiting").is_some());
    }

    #[test]
    fn the_writer_escapes_label_values_and_help() {
        let mut w = PromWriter::default();
        w.family("m", Kind::Gauge, "a \\ b\nc \"q\"");
        w.sample("m", &[("path", "C:\\DIR"), ("e", "x\n\"y\"")], 1);
        w.sample("plain", &[], 2.5);
        assert_eq!(
            w.finish(),
            "# HELP m a \\\\ b\\nc \"q\"\n# TYPE m gauge\n\
             m{path=\"C:\\\\DIR\",e=\"x\\n\\\"y\\\"\"} 1\n\
             plain 2.5\n"
        );
    }

    #[test]
    fn what_the_writer_writes_parses_back() {
        let labels = [("model_name", "we\"ird\\ \nname"), ("engine", "0")];
        let mut w = PromWriter::default();
        w.family("c_total", Kind::Counter, "A counter.");
        w.sample("c_total", &labels, 3);
        w.sample("c_total", &[], 4);
        w.family("h_seconds", Kind::Histogram, "A histogram.");
        w.bucket("h_seconds", &labels, 0.5, 1);
        w.bucket("h_seconds", &[], "+Inf", 2);
        w.sum("h_seconds", &labels, 0.75);
        w.count("h_seconds", &[], 2);
        let p = parse(&w.finish());
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let names: Vec<&str> = p.samples.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "c_total",
                "c_total",
                "h_seconds_bucket",
                "h_seconds_bucket",
                "h_seconds_sum",
                "h_seconds_count"
            ]
        );
        let s = &p.samples[0];
        assert_eq!(s.label("model_name"), Some("we\"ird\\ \nname"));
        assert_eq!((s.labels.len(), s.value), (2, 3.0));
        assert_eq!(p.samples[2].label("le"), Some("0.5"));
        assert_eq!(p.samples[2].label("model_name"), labels[0].1.into());
        assert_eq!(p.samples[3].labels, [("le".into(), "+Inf".into())]);
        assert_eq!(p.samples[4].value, 0.75);
    }

    /// So does what the recorder serves.
    #[test]
    fn the_record_exposition_parses_without_bad_lines() {
        let c = crate::record::counters::ProxyCounters::default();
        c.response_status(200);
        let p = parse(&c.render());
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert_eq!(p.sum("retrace_record_responses_total"), Some(1.0));
        assert!(p
            .sum("retrace_record_forward_delay_seconds_count")
            .is_some());
    }
}
