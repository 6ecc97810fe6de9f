//! retrace's single integration-test binary: every area adds a module here.

mod aiperf;
mod cancels;
mod choices;
mod compare;
mod fuzz;
mod merge;
mod mock;
mod openai_sdk;
mod probe;
mod real_traffic;
mod real_vllm;
mod record;
mod record_h1;
mod record_scale;
mod record_tokenize;
mod record_upgrade;
mod replay;
mod replay_h1;
mod scale_out;
mod scrape;
mod sessions;
mod start_at;
mod support;
mod synth;
mod trace_cli;
mod trace_stream;
