/// Which API the stream came from (the rules differ, see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Completions,
    Chat,
}

/// vLLM's timing rules for one stream, applied incrementally. Times are ns offsets on one clock.
#[derive(Debug, Clone)]
pub(crate) struct StreamClock {
    api: Api,
    send_ns: u64,
    first_ns: Option<u64>,
    recent_ns: Option<u64>,
    itls_ns: Vec<u64>,
    usage_tokens: Option<u64>,
    chunk_tokens: u64,
}

impl StreamClock {
    pub(crate) fn new(api: Api, send_ns: u64) -> StreamClock {
        StreamClock {
            api,
            send_ns,
            first_ns: None,
            recent_ns: None,
            itls_ns: Vec::new(),
            usage_tokens: None,
            chunk_tokens: 0,
        }
    }

    /// One SSE message (not `[DONE]`) that arrived at `at_ns`: whether its `choices` array was
    /// non-empty, how many tokens it carried, and its `usage.completion_tokens` if any.
    pub(crate) fn on_message(
        &mut self,
        at_ns: u64,
        has_choices: bool,
        tokens: u32,
        usage: Option<u64>,
    ) {
        self.chunk_tokens += u64::from(tokens);
        if has_choices {
            match self.first_ns {
                None => self.first_ns = Some(at_ns),
                Some(_) => {
                    let prev = self.recent_ns.unwrap_or(at_ns);
                    self.itls_ns.push(at_ns.saturating_sub(prev));
                }
            }
            self.recent_ns = Some(at_ns);
        } else {
            // vLLM reads usage only from a message without choices.
            if let Some(u) = usage {
                self.usage_tokens = Some(u);
            }
            if self.api == Api::Chat {
                self.recent_ns = Some(at_ns);
            }
        }
        if has_choices && usage.is_some() && self.usage_tokens.is_none() {
            // Some servers put usage on the last content chunk; keep it as a fallback count.
            self.usage_tokens = usage;
        }
    }

    /// TTFT from the send time, once a content message arrived.
    pub(crate) fn ttft_ns(&self) -> Option<u64> {
        self.first_ns.map(|f| f.saturating_sub(self.send_ns))
    }

    /// E2EL from the send time (see the module docs for which message ends it).
    pub(crate) fn e2el_ns(&self) -> Option<u64> {
        self.first_ns?;
        self.recent_ns.map(|r| r.saturating_sub(self.send_ns))
    }

    #[cfg(test)]
    pub(crate) fn itls_ns(&self) -> &[u64] {
        &self.itls_ns
    }

    pub(crate) fn into_itls(self) -> Vec<u64> {
        self.itls_ns
    }

    /// Output tokens: the usage chunk's `completion_tokens`, else the tokens counted in chunks.
    pub(crate) fn output_tokens(&self) -> u64 {
        self.usage_tokens.unwrap_or(self.chunk_tokens)
    }

    /// Whether the count came from the server's usage chunk.
    #[cfg(test)]
    pub(crate) fn has_usage(&self) -> bool {
        self.usage_tokens.is_some()
    }
}
