//! SIGINT and SIGTERM, handled in one place: `record` and `mock` stop on the first, `replay`
//! stops sending and writes what it measured (a second exits at once), `convert` and `synth`
//! remove their partial output and exit.
//!
//! Once [`Signals::install`] ran, neither signal ends the process by itself: what happens is
//! the caller's (tokio's handlers stay for the process's life).

use std::fmt;

/// SIGINT or SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    Interrupt,
    Terminate,
}

impl Signal {
    /// The exit status of a command it stopped: 128 + the signal's number (130, 143), as a shell
    /// reports a process the signal ended.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Signal::Interrupt => 130,
            Signal::Terminate => 143,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        })
    }
}

/// SIGINT and SIGTERM as they arrive.
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// Handles both signals from now on (call inside a runtime).
    pub(crate) fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// The next signal.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::Interrupt,
            _ = self.term.recv() => Signal::Terminate,
        }
    }
}

/// Resolves on the first SIGINT or SIGTERM. The handlers are installed when this is called, not
/// when the future is first polled: a signal that arrives while a server starts up still stops
/// it cleanly. Call it inside the runtime.
pub(crate) fn shutdown() -> impl std::future::Future<Output = Signal> {
    let signals = Signals::install();
    async move {
        match signals {
            Ok(mut s) => s.recv().await,
            Err(e) => {
                tracing::warn!("cannot handle SIGTERM ({e}); stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
                Signal::Interrupt
            }
        }
    }
}

/// For a command that writes its output without a runtime (`convert`, `synth`): on SIGINT or
/// SIGTERM, prints `said(signal)`, removes every partial file ([`crate::sys::partial::exit`]) and
/// exits with the signal's code. Handled on a thread of its own, installed before this returns.
pub(crate) fn exit_on_signal(
    said: impl Fn(Signal) -> String + Send + 'static,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut signals = {
        let _in = rt.enter();
        Signals::install()?
    };
    std::thread::Builder::new()
        .name("retrace-signals".into())
        .spawn(move || {
            let s = rt.block_on(signals.recv());
            eprintln!("{}", said(s));
            crate::sys::partial::exit(s.exit_code())
        })?;
    Ok(())
}
