//! Varints (LEB128: seven bits a byte, the lowest first, the top bit set on every byte but the
//! last), as postcard writes unsigned integers and the roll-up records their counts and lengths;
//! `bucketer`'s bucket codec and write-buffer rows write and read theirs with these too.

/// Appends `n`.
#[inline]
pub fn put(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n & 0x7f) as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Appends `n` zigzag-encoded ([`zigzag`]), as postcard writes signed integers.
#[inline]
pub fn put_signed(out: &mut Vec<u8>, n: i64) {
    put(out, zigzag(n));
}

/// `n` zigzag-encoded: 0, −1, 1, −2 … as 0, 1, 2, 3 …, so that small magnitudes of either sign
/// make short varints.
#[inline]
pub fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

/// Inverse of [`zigzag`].
#[inline]
pub fn unzigzag(n: u64) -> i64 {
    (n >> 1) as i64 ^ -((n & 1) as i64)
}

/// The varint at the front of `bytes` and its length: ten bytes at most, within `u64`.
#[inline]
pub fn read(bytes: &[u8]) -> Result<(u64, usize), &'static str> {
    let mut n = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        // The tenth byte holds the 64th bit alone, and ends the varint.
        if i == 9 && b > 1 {
            return Err("a varint past 64 bits");
        }
        n |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok((n, i + 1));
        }
    }
    Err("truncated: a varint without its last byte")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_stop_at_64_bits() {
        for n in [0, 1, 127, 128, 16_383, 16_384, u64::from(u32::MAX), u64::MAX] {
            let mut v = Vec::new();
            put(&mut v, n);
            assert_eq!(read(&v), Ok((n, v.len())), "{n}");
        }
        let mut v = Vec::new();
        put(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        assert_eq!(read(&[0xac, 0x02, 0x07]), Ok((300, 2)));
        let mut max = Vec::new();
        put(&mut max, u64::MAX);
        assert_eq!(max, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        let past = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(read(&past), Err("a varint past 64 bits"));
        assert_eq!(read(&[0x80]), Err("truncated: a varint without its last byte"));
        assert_eq!(read(&[]), Err("truncated: a varint without its last byte"));
        for (n, want) in [(0i64, 0u8), (-1, 1), (1, 2), (-2, 3), (63, 126), (-64, 127)] {
            let mut v = Vec::new();
            put_signed(&mut v, n);
            assert_eq!(v, [want]);
            assert_eq!(unzigzag(u64::from(want)), n);
        }
        let mut v = Vec::new();
        put_signed(&mut v, i64::MIN);
        assert_eq!(read(&v).map(|(n, _)| unzigzag(n)), Ok(i64::MIN));
    }
}
