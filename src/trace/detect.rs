//! Detecting a trace file's format from its content.
