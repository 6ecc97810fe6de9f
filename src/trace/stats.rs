//! Trace statistics for `inspect`.
