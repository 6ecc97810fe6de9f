//! The integration test binary: servers on 127.0.0.1:0, the tool run in-process.

mod replay;
mod support;
