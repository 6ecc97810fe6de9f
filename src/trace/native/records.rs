use super::*;
use crate::trace::shadow::{Agreement, ShadowCopy, MAX_SHADOWS};

#[derive(Serialize, Deserialize)]
pub(super) struct HeaderWire {
    pub(super) magic: String,
    pub(super) version: (u16, u16),
    #[serde(flatten)]
    pub(super) header: TraceHeader,
}

#[derive(Serialize, Deserialize)]
pub(super) struct FrameWire {
    pub(super) frame: u64,
    pub(super) n: u64,
    pub(super) first: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) dropped: u64,
}

pub(super) fn is_zero(v: &u64) -> bool {
    *v == 0
}
pub(super) fn is_false(v: &bool) -> bool {
    !*v
}

#[derive(Serialize, Deserialize, Default)]
pub(super) struct RequestWire {
    #[serde(default)]
    pub(super) t: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) i: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) o: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) h: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) e: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) v: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) m: Option<String>,
    #[serde(default, skip_serializing_if = "Params::is_empty")]
    pub(super) p: Params,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) s: Option<Session>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_bytes")]
    pub(super) b: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) r: Option<ResponseWire>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ic: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) sh: Vec<ShadowWire>,
}

/// A shadow copy (`trace::shadow::ShadowCopy`).
#[derive(Serialize, Deserialize, Default)]
pub(super) struct ShadowWire {
    #[serde(default)]
    pub(super) k: u8,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) d: u64,
    /// µs from the primary's arrival to its request being whole (format 1.7).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) q: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) sk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) r: Option<ResponseWire>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) o: u64,
    /// `[primary hash, shadow hash, agreeing prefix, primary length, shadow length]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ag: Option<(u64, u64, u64, u64, u64)>,
}

impl ShadowWire {
    fn from_copy(c: &ShadowCopy) -> ShadowWire {
        ShadowWire {
            k: c.target,
            d: c.sent_us,
            q: c.ready_us,
            sk: c.skipped.clone(),
            r: c.response.as_deref().map(ResponseWire::from_response),
            o: c.output_tokens,
            ag: c.agreement.map(|a| {
                (
                    a.primary_hash,
                    a.shadow_hash,
                    a.prefix,
                    a.primary_len,
                    a.shadow_len,
                )
            }),
        }
    }

    fn into_copy(self) -> Result<ShadowCopy, String> {
        if usize::from(self.k) >= MAX_SHADOWS {
            return Err(format!("shadow target {} (at most {MAX_SHADOWS})", self.k));
        }
        if self.o > crate::trace::rows::MAX_TOKENS {
            let max = crate::trace::rows::MAX_TOKENS;
            return Err(format!(
                "shadow output of {} tokens: over the limit of {max}",
                self.o
            ));
        }
        let agreement = match self.ag {
            Some((_, _, p, a, b)) if p > a.min(b) => {
                return Err(format!(
                    "shadow agreement prefix {p} is longer than an output ({a}, {b} bytes)"
                ));
            }
            Some((primary_hash, shadow_hash, prefix, primary_len, shadow_len)) => Some(Agreement {
                primary_hash,
                shadow_hash,
                prefix,
                primary_len,
                shadow_len,
            }),
            None => None,
        };
        Ok(ShadowCopy {
            target: self.k,
            sent_us: self.d,
            ready_us: self.q.min(self.d),
            skipped: self.sk,
            response: self
                .r
                .map(|r| r.into_response().map(Box::new))
                .transpose()?,
            output_tokens: self.o,
            agreement,
        })
    }
}

#[derive(Serialize, Deserialize, Default)]
pub(super) struct ResponseWire {
    #[serde(default)]
    pub(super) st: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) er: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) hd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) tf: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) eg: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) et: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) en: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) u: Option<(u64, u64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) sm: Option<ServerMetrics>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub(super) c: bool,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_bytes")]
    pub(super) b: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) ch: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) x: Option<PastCapWire>,
}

#[derive(Serialize, Deserialize, Default)]
pub(super) struct PastCapWire {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) n: u64,
    #[serde(default, skip_serializing_if = "is_false")]
    pub(super) s: bool,
}

pub(super) mod opt_bytes {
    use serde::{Deserialize, Deserializer, Serializer};
    pub(crate) fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_bytes(b),
            None => s.serialize_none(),
        }
    }
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        Ok(Option::<serde_bytes::ByteBuf>::deserialize(d)?.map(|b| b.into_vec()))
    }
}

/// Encodes ids as flat runs of consecutive values.
pub(crate) fn encode_runs(ids: &[u64], out: &mut Vec<u64>) {
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut len = 1u64;
        while i + (len as usize) < ids.len()
            && start.checked_add(len) == Some(ids[i + len as usize])
        {
            len += 1;
        }
        out.push(start);
        out.push(len);
        i += len as usize;
    }
}

/// Decodes flat runs; `limit` caps the total ids (corrupt input must not allocate unboundedly).
#[cfg(test)]
pub(crate) fn decode_runs(runs: &[u64], limit: u64) -> Result<Vec<u64>, String> {
    let total = check_runs(runs, limit)?;
    Ok(expand_runs(runs, total))
}

/// The number of ids flat runs declare, checked as [`decode_runs`] checks them, nothing
/// allocated: an even length, no overflow, at most `limit` ids.
pub(super) fn check_runs(runs: &[u64], limit: u64) -> Result<u64, String> {
    if runs.len() % 2 != 0 {
        return Err("hash id runs have odd length".into());
    }
    let total = runs
        .chunks(2)
        .try_fold(0u64, |acc, r| acc.checked_add(r[1]))
        .ok_or("hash id run lengths overflow")?;
    if total > limit {
        return Err(format!("{total} hash ids exceed the limit of {limit}"));
    }
    if runs
        .chunks(2)
        .any(|r| r[1] > 0 && r[0].checked_add(r[1] - 1).is_none())
    {
        return Err("hash id run overflows u64".into());
    }
    Ok(total)
}

/// The ids of runs that passed [`check_runs`] (`total` of them).
pub(super) fn expand_runs(runs: &[u64], total: u64) -> Vec<u64> {
    let mut out = Vec::with_capacity(total as usize);
    for r in runs.chunks_exact(2) {
        out.extend((0..r[1]).map(|k| r[0].wrapping_add(k)));
    }
    out
}

/// A decoded record whose hash ids are still the runs it was stored as (checked, as small as
/// its frame): they are expanded only when the record is handed out, so a reader holds the
/// expanded ids of one record at a time, never a frame's.
pub(super) struct Unexpanded {
    pub(super) req: Request,
    pub(super) runs: Vec<u64>,
    pub(super) ids: u64,
}

impl Unexpanded {
    pub(super) fn expand(self) -> Request {
        Request {
            hash_ids: expand_runs(&self.runs, self.ids),
            ..self.req
        }
    }
}

impl RequestWire {
    /// The wire form of a record; `prev_arrival` is the previous record's arrival.
    pub(super) fn from_request(r: &Request, prev_arrival: u64) -> RequestWire {
        let mut h = Vec::new();
        encode_runs(&r.hash_ids, &mut h);
        RequestWire {
            t: r.arrival_us as i64 - prev_arrival as i64,
            i: r.input_tokens,
            o: r.output_tokens,
            h,
            e: match &r.endpoint {
                Endpoint::Completions => None,
                e => Some(e.as_str().to_string()),
            },
            v: r.method.clone(),
            m: r.model.clone(),
            p: r.params.clone(),
            s: r.session.clone(),
            b: r.body.clone(),
            r: r.response.as_deref().map(ResponseWire::from_response),
            ic: r.input_count.wire().map(str::to_string),
            sh: r.shadows.iter().map(ShadowWire::from_copy).collect(),
        }
    }

    /// The record, checked whole; its ids left as runs.
    pub(super) fn into_unexpanded(
        self,
        prev_arrival: u64,
        header: &TraceHeader,
    ) -> Result<Unexpanded, String> {
        let arrival = prev_arrival as i64 + self.t;
        if arrival < 0 {
            return Err(format!("negative arrival time {arrival} µs"));
        }
        let max = crate::trace::rows::MAX_TOKENS;
        if self.i > max || self.o > max {
            return Err(format!(
                "input {} / output {} tokens: over the limit of {max}",
                self.i, self.o
            ));
        }
        if self.sh.len() > MAX_SHADOWS {
            return Err(format!(
                "{} shadow copies (at most {MAX_SHADOWS})",
                self.sh.len()
            ));
        }
        let id_limit = crate::trace::rows::id_limit(header.blocks_for(self.i));
        let ids = check_runs(&self.h, id_limit)
            .map_err(|e| format!("{e} (input length {} allows {id_limit})", self.i))?;
        let req = Request {
            arrival_us: arrival as u64,
            session: self.s,
            method: self.v,
            endpoint: self
                .e
                .as_deref()
                .map_or(Endpoint::Completions, Endpoint::parse),
            model: self.m,
            params: self.p,
            input_tokens: self.i,
            output_tokens: self.o,
            hash_ids: Vec::new(),
            response: self
                .r
                .map(|r| r.into_response().map(Box::new))
                .transpose()?,
            body: self.b,
            input_count: crate::trace::InputCount::from_wire(self.ic.as_deref()),
            shadows: self
                .sh
                .into_iter()
                .map(ShadowWire::into_copy)
                .collect::<Result<_, _>>()?,
        };
        Ok(Unexpanded {
            req,
            runs: self.h,
            ids,
        })
    }
}

impl ResponseWire {
    pub(super) fn from_response(r: &Response) -> ResponseWire {
        let mut prev = 0u64;
        let eg = r
            .events
            .iter()
            .map(|e| {
                let g = e.offset_us.saturating_sub(prev);
                prev = e.offset_us.max(prev);
                g
            })
            .collect();
        let et = if r.events.iter().all(|e| e.tokens == 1) {
            Vec::new()
        } else {
            r.events.iter().map(|e| e.tokens).collect()
        };
        ResponseWire {
            st: r.status,
            er: r.error.clone(),
            hd: r.headers_us,
            tf: r.ttft_us,
            eg,
            et,
            en: r.end_us,
            u: r.usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
            sm: r.server_metrics.clone(),
            c: r.cancelled,
            b: r.body.clone(),
            ch: r.choice_tokens.clone(),
            x: r.past_cap.map(|p| PastCapWire {
                n: p.events,
                s: p.stopped,
            }),
        }
    }

    pub(super) fn into_response(self) -> Result<Response, String> {
        if self.ch.len() > crate::trace::MAX_CHOICES {
            let max = crate::trace::MAX_CHOICES;
            return Err(format!("{} choices counted (at most {max})", self.ch.len()));
        }
        if let Some(x) = self.x.as_ref().filter(|x| x.n > self.eg.len() as u64) {
            return Err(format!(
                "{} events past the capture cap, of {} events",
                x.n,
                self.eg.len()
            ));
        }
        if !self.et.is_empty() && self.et.len() != self.eg.len() {
            return Err(format!(
                "{} event gaps but {} event token counts",
                self.eg.len(),
                self.et.len()
            ));
        }
        let mut off = 0u64;
        let events = self
            .eg
            .iter()
            .enumerate()
            .map(|(k, g)| {
                off = off.saturating_add(*g);
                Event {
                    offset_us: off,
                    tokens: self.et.get(k).copied().unwrap_or(1),
                }
            })
            .collect();
        Ok(Response {
            status: self.st,
            error: self.er,
            headers_us: self.hd,
            ttft_us: self.tf,
            events,
            end_us: self.en,
            usage: self.u.map(|(p, c)| Usage {
                prompt_tokens: p,
                completion_tokens: c,
            }),
            server_metrics: self.sm,
            cancelled: self.c,
            body: self.b,
            choice_tokens: self.ch,
            past_cap: self.x.map(|x| PastCap {
                events: x.n,
                stopped: x.s,
            }),
        })
    }
}

/// One zstd frame of `content` into `out` (replaced), through a reused context: the same bytes
/// as a fresh compressor at the context's level with a content checksum (content size in the
/// frame header).
pub(super) fn compress_into(
    zc: &mut zstd::bulk::Compressor<'static>,
    content: &[u8],
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    out.clear();
    out.reserve(zstd::zstd_safe::compress_bound(content.len()));
    zc.compress_to_buffer(content, out)?;
    Ok(())
}

pub(super) fn cbor<T: Serialize>(v: &T, out: &mut Vec<u8>) {
    // Writing CBOR into a Vec cannot fail for these plain data types.
    ciborium::into_writer(v, &mut *out).expect("CBOR encoding into memory");
}

/// Appends one record as the trace writer encodes it, `prev_arrival` being the previous
/// record's arrival in the same file.
pub(crate) fn encode_record(r: &Request, prev_arrival: u64, out: &mut Vec<u8>) {
    cbor(&RequestWire::from_request(r, prev_arrival), out);
}
