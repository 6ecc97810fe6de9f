//! The word-at-a-time search for the end of a plain run inside a JSON string, for the one-pass
//! chunk scanner in [`crate::wire::openai`]: eight bytes are tested at once with the classic "has a zero
//! byte" bit trick. It exists because the set it looks for includes a byte range (control
//! characters, which make a string invalid JSON), which `memchr` does not search; searches for
//! one to three fixed bytes use `memchr` (as [`crate::wire::sse`] does). Pure; no allocation, no
//! `unsafe`. It does not parse anything itself.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

fn word(hay: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&hay[i..i + 8]);
    u64::from_le_bytes(w)
}

/// High bit set in the lowest byte of `x` equal to `c` (and possibly in later bytes: a borrow
/// only runs upwards, so the lowest flag is always exact; callers use only that one).
fn eq_mask(x: u64, c: u8) -> u64 {
    let v = x ^ (ONES * u64::from(c));
    v.wrapping_sub(ONES) & !v & HIGH
}

/// Index of the first byte in `hay[from..]` that ends a plain run inside a JSON string: `"`,
/// `\` or a control character (below 0x20); `hay.len()` when there is none.
#[inline]
pub(crate) fn find_json_special(hay: &[u8], from: usize) -> usize {
    let mut i = from;
    while i + 8 <= hay.len() {
        let x = word(hay, i);
        // bytes below 0x20 (the lowest flag is exact, as in `eq_mask`)
        let control = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
        let m = eq_mask(x, b'"') | eq_mask(x, b'\\') | control;
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < hay.len() {
        if matches!(hay[i], b'"' | b'\\' | 0..=0x1f) {
            return i;
        }
        i += 1;
    }
    hay.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn agree_with_byte_by_byte_search(
            hay in proptest::collection::vec(
                prop_oneof![any::<u8>(), Just(b'"'), Just(b'\\'), Just(b'\n'), Just(b'\r'), 0x20u8..0x7f],
                0..80,
            ),
            from in 0usize..90,
        ) {
            let from = from.min(hay.len());
            let naive = hay[from..]
                .iter()
                .position(|&c| matches!(c, b'"' | b'\\' | 0..=0x1f))
                .map_or(hay.len(), |p| from + p);
            prop_assert_eq!(find_json_special(&hay, from), naive);
        }
    }

    #[test]
    fn finds_in_every_position_of_a_word() {
        for n in 0..24 {
            for pos in 0..n {
                for c in [b'"', b'\\', 0x00, 0x1f] {
                    let mut v = vec![b'a'; n];
                    v[pos] = c;
                    assert_eq!(find_json_special(&v, 0), pos, "{n} {pos} {c}");
                }
            }
            assert_eq!(find_json_special(&vec![0x80u8; n], 0), n);
        }
    }
}
