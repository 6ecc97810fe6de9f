//! `retrace record`'s command line and its [`RecordConfig`]. The flags' defaults are
//! [`defaults`]'.

use super::values::{duration_text, parse_duration, parse_size, size_text};
use crate::record::shadow::{Secret, ShadowConfig};
use crate::record::{defaults, Bodies, RecordConfig};
use anyhow::{bail, Context};
use std::path::PathBuf;

/// Record live traffic: a transparent proxy in front of an OpenAI-compatible server.
///
/// Put retrace inline in front of a server and record its traffic into native traces, without
/// changing a byte of it. Files: DIR/<name>-<start>-<seq>.trace.zst (written as .partial,
/// renamed when closed). Prompt and completion text are not stored unless `--bodies` says so;
/// credentials (Authorization, api-key, cookies) never reach a trace. Details: docs/record.md.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  # clients talk to :8080 instead of the server's :8000; prompts kept
  retrace record --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000 \\
    --out recorded/ --bodies request")]
pub struct RecordArgs {
    /// Address to accept clients on (HTTP/1.1 and HTTP/2; TLS with --tls-cert/--tls-key).
    #[arg(long, value_name = "ADDR", help_heading = "Proxy")]
    pub(crate) listen: String,
    /// The server to forward to, e.g. `http://127.0.0.1:8001` or `https://llm.internal/prefix`.
    #[arg(long, value_name = "URL", help_heading = "Proxy")]
    pub(crate) upstream: String,
    /// Directory for trace files `<name>-<start>-<seq>.trace.zst` (created if missing).
    #[arg(long, value_name = "DIR", help_heading = "Proxy")]
    pub(crate) out: PathBuf,
    /// File name prefix of the trace files.
    #[arg(long, default_value = defaults::NAME, help_heading = "Proxy", hide_short_help = true)]
    pub(crate) name: String,
    /// PEM certificate chain to terminate TLS (ALPN h2 and http/1.1); needs --tls-key.
    #[arg(long, value_name = "PEM", help_heading = "TLS", hide_short_help = true)]
    pub(crate) tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "PEM", help_heading = "TLS", hide_short_help = true)]
    pub(crate) tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) to trust for an https upstream (default: the system bundle).
    #[arg(long, value_name = "PEM", help_heading = "TLS", hide_short_help = true)]
    pub(crate) upstream_ca: Option<PathBuf>,
    /// Speak HTTP/2 to the upstream (h2c prior knowledge, or ALPN h2 over TLS).
    #[arg(long, help_heading = "TLS", hide_short_help = true)]
    pub(crate) upstream_http2: bool,
    /// Limit for connecting to the upstream.
    #[arg(long, default_value_t = duration_text(defaults::CONNECT_TIMEOUT), value_name = "DURATION", help_heading = "Limits", hide_short_help = true)]
    pub(crate) connect_timeout: String,
    /// Limit from request arrival to the upstream's response headers (long: a queued
    /// non-streamed generation sends its headers at the end).
    #[arg(long, default_value_t = duration_text(defaults::HEADERS_TIMEOUT), value_name = "DURATION", help_heading = "Limits", hide_short_help = true)]
    pub(crate) headers_timeout: String,
    /// Longest silence between two response chunks before the response is cut.
    #[arg(long, default_value_t = duration_text(defaults::IDLE_TIMEOUT), value_name = "DURATION", help_heading = "Limits", hide_short_help = true)]
    pub(crate) idle_timeout: String,
    /// Optional limit on a whole exchange (`none` by default: long generations are normal).
    #[arg(
        long,
        value_name = "DURATION",
        help_heading = "Limits",
        hide_short_help = true
    )]
    pub(crate) total_timeout: Option<String>,
    /// On SIGINT/SIGTERM, how long in-flight streams may take to finish before the trace is closed
    /// (upgraded tunnels, e.g. WebSockets, are cut just before; see docs/record.md).
    #[arg(long, default_value_t = duration_text(defaults::DRAIN_TIMEOUT), value_name = "DURATION", help_heading = "Limits", hide_short_help = true)]
    pub(crate) drain_timeout: String,
    /// Bodies to keep in the trace: none (default), request (prompts), full (prompts and outputs).
    #[arg(long, default_value = bodies_name(defaults::BODIES), value_name = "none|request|full", help_heading = "What is kept")]
    pub(crate) bodies: String,
    /// File holding a secret key: block hashes become HMAC-SHA256, so a shared trace cannot be
    /// matched against guessed prompts.
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "What is kept",
        hide_short_help = true
    )]
    pub(crate) hash_key_file: Option<PathBuf>,
    /// Hugging Face `tokenizer.json` for exact text-prompt blocks (token-id prompts are always
    /// exact; without it text is approximated as 4 bytes per token and the input length is taken
    /// from the server's usage).
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "What is kept",
        hide_short_help = true
    )]
    pub(crate) tokenizer: Option<PathBuf>,
    /// Never send a request of the proxy's own upstream. Without it (and without --tokenizer), a
    /// text prompt whose length no usage gave is counted with the upstream's `POST /tokenize`,
    /// off the forwarding path, rate-bounded (docs/record.md, "Input lengths").
    #[arg(long, help_heading = "What is kept", hide_short_help = true)]
    pub(crate) no_upstream_tokenize: bool,
    /// Most `POST /tokenize` requests of the proxy's own per second (at most 4 in flight).
    #[arg(long, default_value_t = defaults::UPSTREAM_TOKENIZE_RATE, value_name = "N", help_heading = "What is kept", hide_short_help = true)]
    pub(crate) upstream_tokenize_rate: u32,
    /// Tokens per hash block (512 matches Mooncake traces).
    #[arg(long, default_value_t = defaults::BLOCK_SIZE, help_heading = "What is kept", hide_short_help = true)]
    pub(crate) block_size: u32,
    /// Records the writer may queue; beyond that records are dropped and counted, never traffic slowed.
    #[arg(long, default_value_t = defaults::QUEUE, help_heading = "Limits", hide_short_help = true)]
    pub(crate) queue: usize,
    /// Captured body bytes the writer queue may hold (bounds memory when the disk is slow).
    #[arg(long, default_value_t = size_text(defaults::QUEUE_BYTES), value_name = "SIZE", help_heading = "Limits", hide_short_help = true)]
    pub(crate) queue_bytes: String,
    /// Bytes captured per request and per response body for recording (bodies are always
    /// forwarded whole; a stream's events are still counted past it).
    #[arg(long, default_value_t = size_text(defaults::CAPTURE_MAX), value_name = "SIZE", help_heading = "Limits", hide_short_help = true)]
    pub(crate) capture_max: String,
    /// Start a new trace file after this many compressed bytes.
    #[arg(long, default_value_t = size_text(defaults::ROTATE_BYTES), value_name = "SIZE", help_heading = "Files", hide_short_help = true)]
    pub(crate) rotate_size: String,
    /// Start a new trace file after this long.
    #[arg(long, default_value_t = duration_text(defaults::ROTATE_EVERY), value_name = "DURATION", help_heading = "Files", hide_short_help = true)]
    pub(crate) rotate_interval: String,
    /// Admin endpoint (`/metrics`, `/healthz`); `none` turns it off.
    #[arg(long, default_value_t = defaults::ADMIN.to_string(), value_name = "ADDR", help_heading = "Files", hide_short_help = true)]
    pub(crate) admin: String,
    /// Threads serving connections, each a single-threaded runtime (0: one per CPU). Tuning,
    /// hidden: see docs/tuning.md.
    #[arg(long, default_value_t = defaults::IO_THREADS, value_name = "N", hide = true)]
    pub(crate) io_threads: usize,
    /// Also send a copy of each workload request to this candidate server, timed as the
    /// upstream's response is and kept in the same record (repeatable, at most 4). The client is
    /// answered by the upstream alone. Judge it with `retrace compare --shadow`; docs/shadow.md.
    #[arg(long, value_name = "URL", help_heading = "Shadow")]
    pub(crate) shadow: Vec<String>,
    /// A second copy of the upstream's own build, mirrored too: `compare --shadow` flags only
    /// what exceeds the upstream–control spread.
    #[arg(
        long,
        value_name = "URL",
        help_heading = "Shadow",
        hide_short_help = true
    )]
    pub(crate) shadow_control: Option<String>,
    /// The `model` the copies ask for (default: the client's).
    #[arg(
        long,
        value_name = "NAME",
        help_heading = "Shadow",
        hide_short_help = true
    )]
    pub(crate) shadow_model: Option<String>,
    /// The environment variable holding the shadows' API key (the client's credentials are never
    /// sent to a shadow).
    #[arg(
        long,
        value_name = "VAR",
        help_heading = "Shadow",
        hide_short_help = true
    )]
    pub(crate) shadow_api_key_env: Option<String>,
    /// The share of workload requests mirrored, chosen by the request body's hash (0 to 1).
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "F",
        help_heading = "Shadow",
        hide_short_help = true
    )]
    pub(crate) shadow_fraction: f64,
    /// Most copies in flight at once; beyond it a copy is skipped and counted.
    #[arg(long, default_value_t = crate::record::shadow::DEFAULT_MAX_IN_FLIGHT, value_name = "N", help_heading = "Shadow", hide_short_help = true)]
    pub(crate) shadow_max_in_flight: usize,
}

impl RecordArgs {
    /// The config the command line asks for; errors name the flag.
    pub fn config(&self) -> anyhow::Result<RecordConfig> {
        let a = self;
        let base = RecordConfig::new(&a.upstream, a.out.clone())?;
        if a.name.is_empty() || a.name.contains(['/', '\\']) {
            bail!("--name {:?}: must be a plain file name prefix", a.name);
        }
        let tls = match (&a.tls_cert, &a.tls_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => bail!("--tls-cert and --tls-key go together"),
        };
        let total_timeout = match a.total_timeout.as_deref() {
            None | Some("none") | Some("off") => None,
            Some(s) => Some(parse_duration(s).context("--total-timeout")?),
        };
        let bodies = parse_bodies(&a.bodies)?;
        let hash_key = a.hash_key_file.as_deref().map(read_hash_key).transpose()?;
        if a.block_size == 0 {
            bail!("--block-size must be at least 1");
        }
        if a.upstream_tokenize_rate == 0 {
            bail!(
                "--upstream-tokenize-rate must be at least 1 (--no-upstream-tokenize turns it off)"
            );
        }
        let admin = match a.admin.as_str() {
            "none" | "off" => None,
            s => Some(
                s.parse()
                    .with_context(|| format!("--admin {s:?}: expected IP:PORT or none"))?,
            ),
        };
        let shadow = self.shadow_config(&base)?;
        Ok(RecordConfig {
            shadow,
            name: a.name.clone(),
            tls,
            upstream_ca: a.upstream_ca.clone(),
            upstream_http2: a.upstream_http2,
            connect_timeout: parse_duration(&a.connect_timeout).context("--connect-timeout")?,
            headers_timeout: parse_duration(&a.headers_timeout).context("--headers-timeout")?,
            idle_timeout: parse_duration(&a.idle_timeout).context("--idle-timeout")?,
            total_timeout,
            drain_timeout: parse_duration(&a.drain_timeout).context("--drain-timeout")?,
            bodies,
            hash_key,
            tokenizer: a.tokenizer.clone(),
            upstream_tokenize: !a.no_upstream_tokenize,
            upstream_tokenize_rate: a.upstream_tokenize_rate,
            block_size: a.block_size,
            queue: a.queue.max(1),
            queue_bytes: parse_size(&a.queue_bytes).context("--queue-bytes")?,
            capture_max: parse_size(&a.capture_max).context("--capture-max")? as usize,
            rotate_bytes: parse_size(&a.rotate_size).context("--rotate-size")?,
            rotate_every: parse_duration(&a.rotate_interval).context("--rotate-interval")?,
            admin,
            io_threads: a.io_threads,
            ..base
        })
    }
}

impl RecordArgs {
    /// The `--shadow` flags' configuration (`None` without `--shadow`).
    fn shadow_config(&self, base: &RecordConfig) -> anyhow::Result<Option<ShadowConfig>> {
        let a = self;
        if a.shadow.is_empty() {
            let given = [
                (a.shadow_control.is_some(), "--shadow-control"),
                (a.shadow_model.is_some(), "--shadow-model"),
                (a.shadow_api_key_env.is_some(), "--shadow-api-key-env"),
            ];
            if let Some((_, flag)) = given.iter().find(|(g, _)| *g) {
                bail!("{flag} needs --shadow URL");
            }
            return Ok(None);
        }
        if !(0.0..=1.0).contains(&a.shadow_fraction) {
            bail!(
                "--shadow-fraction {}: must be between 0 and 1",
                a.shadow_fraction
            );
        }
        if a.shadow_max_in_flight == 0 {
            bail!("--shadow-max-in-flight must be at least 1");
        }
        let mut sc =
            ShadowConfig::new(&a.shadow, a.shadow_control.as_deref(), base.upstream_uri())?;
        sc.model = a.shadow_model.clone();
        sc.fraction = a.shadow_fraction;
        sc.max_in_flight = a.shadow_max_in_flight;
        if let Some(var) = &a.shadow_api_key_env {
            let key = std::env::var(var)
                .with_context(|| format!("--shadow-api-key-env {var}: the variable is not set"))?;
            sc.api_key = Some(Secret(key.trim().to_string()));
        }
        Ok(Some(sc))
    }
}

/// `--bodies`' names of [`Bodies`].
const BODIES: [(&str, Bodies); 3] = [
    ("none", Bodies::None),
    ("request", Bodies::Request),
    ("full", Bodies::Full),
];

/// The name `--bodies` gives `b`.
fn bodies_name(b: Bodies) -> &'static str {
    BODIES
        .iter()
        .find(|(_, v)| *v == b)
        .map_or("none", |(n, _)| n)
}

fn parse_bodies(s: &str) -> anyhow::Result<Bodies> {
    match BODIES.iter().find(|(n, _)| *n == s) {
        Some((_, b)) => Ok(*b),
        None => bail!("--bodies {s:?}: expected none, request or full"),
    }
}

/// The `--hash-key-file` key: the file's bytes, trailing whitespace cut.
fn read_hash_key(p: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let mut k = std::fs::read(p).with_context(|| format!("--hash-key-file {}", p.display()))?;
    while k.last().is_some_and(|b| b.is_ascii_whitespace()) {
        k.pop();
    }
    if k.is_empty() {
        bail!("--hash-key-file {}: the key is empty", p.display());
    }
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_flags_alone_give_the_defaults() {
        let argv = [
            "retrace",
            "record",
            "--listen=-",
            "--upstream=http://h:1",
            "--out=o",
        ];
        let cli = <crate::cli::Cli as clap::Parser>::parse_from(argv);
        let crate::cli::Command::Record(a) = cli.command else {
            unreachable!("record")
        };
        let mut expected = RecordConfig::new("http://h:1", "o").unwrap();
        expected.admin = Some(defaults::ADMIN);
        let parsed = a.config().unwrap();
        assert_eq!(format!("{parsed:?}"), format!("{expected:?}"));
    }
}
