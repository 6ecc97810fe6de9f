//! Word-at-a-time byte searches for the per-event parsers ([`crate::sse`], [`crate::openai`]):
//! eight bytes are tested at once with the classic "has a zero byte" bit trick, and only the
//! word that may hold a match is searched byte by byte. Pure; no allocation, no `unsafe`. It does
//! not parse anything itself.

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

/// Index of the first `a` or `b` in `hay[from..]`, or `hay.len()`.
pub fn find2(hay: &[u8], from: usize, a: u8, b: u8) -> usize {
    let mut i = from;
    while i + 8 <= hay.len() {
        let m = {
            let x = word(hay, i);
            eq_mask(x, a) | eq_mask(x, b)
        };
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < hay.len() {
        if hay[i] == a || hay[i] == b {
            return i;
        }
        i += 1;
    }
    hay.len()
}

/// Index of the first byte in `hay[from..]` that ends a plain run inside a JSON string: `"`,
/// `\` or a control character (below 0x20); `hay.len()` when there is none.
pub fn find_json_special(hay: &[u8], from: usize) -> usize {
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
            let naive2 = hay[from..].iter().position(|&c| c == b'\n' || c == b'\r').map_or(hay.len(), |p| from + p);
            prop_assert_eq!(find2(&hay, from, b'\n', b'\r'), naive2);
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
                let mut v = vec![0xffu8; n];
                v[pos] = b'\r';
                assert_eq!(find2(&v, 0, b'\n', b'\r'), pos);
            }
            assert_eq!(find_json_special(&vec![0x80u8; n], 0), n);
        }
    }
}
