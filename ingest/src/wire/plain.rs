//! The fast path of JSON decoding: payloads in the plain form nearly every device sends, read by
//! a scanner of our own instead of `serde_json`'s visitors.
//!
//! The plain form is one reading object, or an array of them, in which no string has an escape
//! and every member's value is a number, a string, `true`, `false` or `null`, and which decodes
//! without a single dead letter. Anything else — an escape, a nested value, a rejected reading,
//! a syntax error, a number `serde_json` might read differently — makes [`readings`] give up
//! (`None`), and the payload is read again by the general decoder, which owns every message and
//! rule. The readings the fast path yields are therefore exactly the general decoder's: the
//! members are judged by the same [`Decoder`] methods, and the numbers read as `serde_json`
//! reads them (property tests compare the two decoders on arbitrary payloads).

use model::{DeviceReading, Value};

use super::{ts_from_json_number, ts_from_rfc3339, Decoder, Ts, MAX_TS, MIN_TS};

/// Decodes `text` if it is in the plain form, appending its readings to `out`; `None` if it is
/// not, with `out` possibly holding some of its readings (the caller discards them).
pub(super) fn readings(decoder: &mut Decoder<'_>, text: &str, out: &mut Vec<DeviceReading>) -> Option<()> {
    let mut scan = Scan { text, src: text.as_bytes(), at: 0 };
    scan.whitespace();
    match scan.peek()? {
        b'[' => {
            scan.at += 1;
            scan.whitespace();
            if scan.peek()? == b']' {
                scan.at += 1;
            } else {
                loop {
                    scan.whitespace();
                    out.push(reading(decoder, &mut scan)?);
                    scan.whitespace();
                    match scan.next()? {
                        b',' => {}
                        b']' => break,
                        _ => return None,
                    }
                }
            }
        }
        b'{' => out.push(reading(decoder, &mut scan)?),
        _ => return None,
    }
    scan.whitespace();
    (scan.at == text.len()).then_some(())
}

/// One reading object, the scanner at its `{`.
fn reading(decoder: &mut Decoder<'_>, scan: &mut Scan<'_>) -> Option<DeviceReading> {
    if scan.next()? != b'{' {
        return None;
    }
    let mut draft = decoder.start_reading();
    scan.whitespace();
    if scan.peek()? == b'}' {
        // No fields: a dead letter, which the general decoder words.
        return None;
    }
    loop {
        scan.whitespace();
        let key = scan.string()?;
        scan.whitespace();
        if scan.next()? != b':' {
            return None;
        }
        scan.whitespace();
        match key {
            "ts" => {
                let ms = match scan.peek()? {
                    b'"' => ts_from_rfc3339(scan.string()?).ok()?,
                    _ => scan.number()?.millis()?,
                };
                draft.ts = Ts::At(ms);
            }
            "device" => {
                let name = scan.string()?;
                decoder.device(&mut draft, name).ok()?;
            }
            name => {
                let value = match scan.peek()? {
                    b'"' => Some(Value::Str(scan.string()?.into())),
                    b't' => scan.literal("true").map(|()| Some(Value::Bool(true)))?,
                    b'f' => scan.literal("false").map(|()| Some(Value::Bool(false)))?,
                    b'n' => scan.literal("null").map(|()| None)?,
                    _ => Some(scan.number()?.field_value()?),
                };
                let field = decoder.field_name(name).ok()?;
                match value {
                    Some(value) => draft.fields.push((field, value)),
                    None => draft.absent(&field),
                }
            }
        }
        scan.whitespace();
        match scan.next()? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
    }
    decoder.finish(draft).ok()
}

/// A position in the payload.
struct Scan<'s> {
    text: &'s str,
    /// `text`'s bytes.
    src: &'s [u8],
    at: usize,
}

/// A JSON number, checked against the grammar.
struct Number<'s> {
    text: &'s str,
    negative: bool,
    /// Its digits without the point, if they fit in a `u64`.
    digits: Option<u64>,
    /// How many of them follow the point.
    fraction: usize,
    /// Whether it has an exponent.
    exponent: bool,
}

/// The powers of ten a `f64` holds exactly.
const EXACT_POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

impl Number<'_> {
    /// The value `serde_json` reads from the text: an integer of up to 64 bits converted to the
    /// nearest `f64` (`-0` as `-0.0`), anything else the `f64` nearest to the decimal value
    /// (`serde_json` with `float_roundtrip` rounds correctly, as the standard library does).
    /// `None` where `serde_json` would take another road: integers beyond 64 bits, and values
    /// out of the `f64` range or rounded to zero (`serde_json` refuses the first and its
    /// sign of the second was not checked).
    fn value(&self) -> Option<f64> {
        let signed = |v: f64| if self.negative { -v } else { v };
        if !self.exponent {
            match (self.digits, self.fraction) {
                (Some(digits), 0) => return Some(signed(digits as f64)),
                (None, 0) => return None,
                // Both exact, so their quotient is the nearest `f64` to the decimal (Clinger's
                // fast path): most values devices send, without the general parse.
                (Some(digits), fraction) if digits < 1 << 53 && fraction < EXACT_POWERS_OF_TEN.len() => {
                    return Some(signed(digits as f64 / EXACT_POWERS_OF_TEN[fraction]))
                }
                _ => {}
            }
        }
        let value = self.text.parse::<f64>().ok()?;
        let mantissa = self.text.split(['e', 'E']).next().unwrap_or_default();
        (value.is_finite() && (value != 0.0 || mantissa.bytes().all(|b| !b.is_ascii_digit() || b == b'0')))
            .then_some(value)
    }

    /// The field value `number_value` makes of what `serde_json` reads from the text: an
    /// integer from ±2^53 on within the `i64` range exactly, as an untyped one; otherwise
    /// [`Number::value`].
    fn field_value(&self) -> Option<Value> {
        if let (Some(digits), 0, false) = (self.digits, self.fraction, self.exponent) {
            if digits >= model::UNTYPED_INT_FROM {
                let exact = if self.negative { 0i64.checked_sub_unsigned(digits) } else { i64::try_from(digits).ok() };
                if let Some(i) = exact {
                    return Some(Value::UntypedInt(i));
                }
            }
        }
        self.value().map(Value::F64)
    }

    /// Epoch milliseconds, as [`ts_from_json_number`] reads them; `None` for what it rejects.
    fn millis(&self) -> Option<i64> {
        match (self.digits, self.fraction, self.exponent) {
            (Some(digits), 0, false) => {
                let magnitude = i64::try_from(digits).ok()?;
                let ms = if self.negative { -magnitude } else { magnitude };
                (MIN_TS..MAX_TS).contains(&ms).then_some(ms)
            }
            _ => ts_from_json_number(self.text).ok(),
        }
    }
}

impl<'s> Scan<'s> {
    fn peek(&self) -> Option<u8> {
        self.src.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A string without escapes or control characters, the scanner at its opening quote.
    fn string(&mut self) -> Option<&'s str> {
        if self.next()? != b'"' {
            return None;
        }
        let start = self.at;
        let len = self.src[start..].iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        self.at = start + len;
        if self.next()? != b'"' {
            return None;
        }
        // Both ends are next to a quote, so on character boundaries.
        Some(&self.text[start..start + len])
    }

    /// `word` (`true`, `false`, `null`), not followed by more of a word.
    fn literal(&mut self, word: &str) -> Option<()> {
        let end = self.at + word.len();
        if self.src.get(self.at..end)? != word.as_bytes() || self.src.get(end).is_some_and(u8::is_ascii_alphanumeric) {
            return None;
        }
        self.at = end;
        Some(())
    }

    /// A number per JSON's grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Option<Number<'s>> {
        let start = self.at;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        if !self.peek()?.is_ascii_digit() {
            return None;
        }
        let mut digits = Some(0u64);
        let leading_zero = self.peek() == Some(b'0');
        let int_digits = self.digits(&mut digits);
        if leading_zero && int_digits > 1 {
            return None;
        }
        let mut fraction = 0;
        if self.peek() == Some(b'.') {
            self.at += 1;
            fraction = self.digits(&mut digits);
            if fraction == 0 {
                return None;
            }
        }
        let exponent = matches!(self.peek(), Some(b'e' | b'E'));
        if exponent {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits(&mut None) == 0 {
                return None;
            }
        }
        // A letter or a `.` straight after is not JSON (`1x`, `1e5.0`).
        if matches!(self.peek(), Some(b'.' | b'a'..=b'z' | b'A'..=b'Z')) {
            return None;
        }
        // Only ASCII was consumed.
        Some(Number { text: &self.text[start..self.at], negative, digits, fraction, exponent })
    }

    /// Skips digits, adding them to `value` (`None` once it no longer fits); how many.
    fn digits(&mut self, value: &mut Option<u64>) -> usize {
        let start = self.at;
        while let Some(b @ b'0'..=b'9') = self.peek() {
            *value = value.and_then(|v| v.checked_mul(10)?.checked_add(u64::from(b - b'0')));
            self.at += 1;
        }
        self.at - start
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_json_generally, decode_json_into, Named, Out};
    use super::*;
    use model::{DeadLetter, IngestBatch};
    use proptest::prelude::*;

    /// The fast path's readings of `payload` for table `t`, the topic naming `device`.
    fn fast(device: Option<&str>, payload: &str) -> Option<Vec<DeviceReading>> {
        let mut out = Vec::new();
        readings(&mut Decoder::new("t", Named::topic(device)), payload, &mut out).map(|()| out)
    }

    fn out() -> Out<'static> {
        Out { source: "test", received_ms: 7, batch: IngestBatch::default() }
    }

    /// What the decoder makes of `payload` (the fast path if it takes it) and what the general
    /// decoder alone makes of it: readings, dead letters and every field value's bits.
    fn both(device: Option<&str>, payload: &str) -> [Decoded; 2] {
        let parts = |batch: IngestBatch| {
            let bits = batch
                .readings
                .iter()
                .map(|r| r.reading.fields.iter().map(|(_, v)| v.as_number().map_or(u64::MAX, f64::to_bits)).collect())
                .collect();
            (batch.readings, batch.dead_letters, bits)
        };
        [
            parts(decode_json_into("t", Named::topic(device), payload.as_bytes(), out())),
            parts(decode_json_generally("t", Named::topic(device), payload, out())),
        ]
    }

    type Decoded = (Vec<DeviceReading>, Vec<DeadLetter>, Vec<Vec<u64>>);

    #[test]
    fn plain_payloads_take_the_fast_path() {
        let gateway = r#"[{"device":"truck_1","ts":1451606400000,"latitude":52.5,"longitude":-13.25,"ok":true},
            {"ts":"2016-01-01T00:01:00Z", "device" : "truck_2", "latitude": 0, "note": "fine", "gone": null}]"#;
        let got = fast(None, gateway).expect("plain");
        let [decoded, general] = both(None, gateway);
        assert_eq!(got, general.0);
        assert_eq!(decoded, general);
        let expected = |device: &str, ts: i64, fields: Vec<(&str, Value)>| DeviceReading {
            table: "t".into(),
            device: device.into(),
            reading: model::Reading::new(ts, fields.into_iter().map(|(n, v)| (n.into(), v)).collect()),
        };
        assert_eq!(
            got,
            vec![
                expected(
                    "truck_1",
                    1_451_606_400_000,
                    vec![("latitude", Value::F64(52.5)), ("longitude", Value::F64(-13.25)), ("ok", Value::Bool(true))]
                ),
                expected(
                    "truck_2",
                    1_451_606_460_000,
                    vec![("latitude", Value::F64(0.0)), ("note", Value::Str("fine".into()))]
                ),
            ]
        );
        // One reading on a device's topic, naming the device again or not; an empty array.
        let one = fast(Some("d1"), r#" {"ts": 17e11, "device": "d1", "v": -0} "#).expect("plain");
        assert_eq!((&*one[0].device, one[0].reading.ts), ("d1", 1_700_000_000_000));
        assert_eq!(one[0].reading.fields[0].1.as_number().map(f64::to_bits), Some((-0.0f64).to_bits()));
        assert_eq!(fast(Some("d1"), "[ ]"), Some(vec![]));
    }

    #[test]
    fn anything_else_goes_to_the_general_decoder() {
        for (device, payload) in [
            (None, r#"[{"device":"truck_\u0031","ts":1,"v":1}]"#),
            (None, r#"[{"device":"truck_1","ts":1,"v":[1]}]"#),
            (None, r#"[{"device":"truck_1","ts":1,"v":{}}]"#),
            (None, r#"[{"device":"truck_1","ts":1,"v":1},7]"#),
            (None, r#"[{"device":"truck_1","ts":1,"v":1}"#),
            (None, r#"[{"device":"truck_1","ts":1,"v":1}] x"#),
            (None, r#"[{"device":"truck_1","ts":1,"v":1},]"#),
            (None, r#"[{"ts":1,"v":1}]"#),
            (None, r#"[{"device":"bad device","ts":1,"v":1}]"#),
            (Some("d"), r#"{"device":"e","ts":1,"v":1}"#),
            (Some("d"), r#"{"ts":1}"#),
            (Some("d"), r#"{}"#),
            (Some("d"), r#"{"ts":1.5,"v":1}"#),
            (Some("d"), r#"{"ts":null,"v":1}"#),
            (Some("d"), r#"{"ts":"yesterday","v":1}"#),
            (Some("d"), r#"{"ts":1,"1v":1}"#),
            (Some("d"), r#"{"ts":1,"v":1e400}"#),
            (Some("d"), r#"{"ts":1,"v":1e-400}"#),
            (Some("d"), r#"{"ts":1,"v":18446744073709551616}"#),
            (Some("d"), r#"{"ts":1,"v":01}"#),
            (Some("d"), r#"{"ts":1,"v":1.}"#),
            (Some("d"), r#"{"ts":1,"v":.5}"#),
            (Some("d"), r#"{"ts":1,"v":-}"#),
            (Some("d"), r#"{"ts":1,"v":1e}"#),
            (Some("d"), r#"{"ts":1,"v":nul}"#),
            (Some("d"), r#"{"ts":1,"v":truex}"#),
            (Some("d"), "{\"ts\":1,\"v\":\"a\tb\"}"),
            (Some("d"), r#"{"ts":1 "v":1}"#),
            (Some("d"), r#""text""#),
            (Some("d"), ""),
        ] {
            assert_eq!(fast(device, payload), None, "{payload}");
            let [decoded, general] = both(device, payload);
            assert_eq!(decoded, general, "{payload}");
        }
        // Long numbers are read here too, as `serde_json` reads them.
        let long = format!(r#"{{"ts":1,"v":0.{}1}}"#, "0".repeat(300));
        let got = fast(Some("d"), &long).expect("plain");
        assert_eq!(got[0].reading.fields[0].1, Value::F64(1e-301));
    }

    /// Integers from ±2^53 on, within the `i64` range, are read exactly and left untyped, on
    /// both paths; below 2^53, with a fraction or an exponent, or beyond `i64`, numbers are
    /// `f64`s (a fraction from 2^53 on is rounded: 9007199254740993.0 is 2^53).
    #[test]
    fn integers_from_2_53_on_are_read_exactly_and_untyped() {
        let payload = r#"{"ts":1,"a":9007199254740991,"b":9007199254740992,"c":-9007199254740993,
            "d":9223372036854775807,"e":-9223372036854775808,"f":9223372036854775808,"g":-9223372036854775809,
            "h":9007199254740993.0,"i":9.007199254740993e15,"j":-9007199254740991}"#;
        let got = fast(Some("d"), payload).expect("plain");
        let [decoded, general] = both(Some("d"), payload);
        assert_eq!(got, general.0);
        assert_eq!(decoded, general);
        let values: Vec<(&str, Value)> = got[0].reading.fields.iter().map(|(n, v)| (&**n, v.clone())).collect();
        assert_eq!(
            values,
            [
                ("a", Value::F64(9_007_199_254_740_991.0)),
                ("b", Value::UntypedInt(9_007_199_254_740_992)),
                ("c", Value::UntypedInt(-9_007_199_254_740_993)),
                ("d", Value::UntypedInt(i64::MAX)),
                ("e", Value::UntypedInt(i64::MIN)),
                ("f", Value::F64(9_223_372_036_854_775_808.0)),
                ("g", Value::F64(-9_223_372_036_854_775_808.0)),
                ("h", Value::F64(9_007_199_254_740_992.0)),
                ("i", Value::F64(9_007_199_254_740_992.0)),
                ("j", Value::F64(-9_007_199_254_740_991.0)),
            ]
        );
    }

    /// A JSON number's text of any shape the grammar allows.
    fn number_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<f64>().prop_filter("finite", |v| v.is_finite()).prop_map(|v| v.to_string()),
            any::<f64>().prop_filter("finite", |v| v.is_finite()).prop_map(|v| format!("{v:e}")),
            (-100_000i64..100_000).prop_map(|i| format!("{}", i as f64 / 100.0)),
            any::<i64>().prop_map(|v| v.to_string()),
            any::<u64>().prop_map(|v| v.to_string()),
            // Next to 2^53, from which integers are kept exact, and to the ends of `i64`.
            (prop_oneof![Just(1u64 << 53), Just(1u64 << 63)], -3i64..3, any::<bool>()).prop_map(
                |(at, by, negative)| format!("{}{}", if negative { "-" } else { "" }, at.wrapping_add_signed(by))
            ),
            "-?(0|[1-9][0-9]{0,25})(\\.[0-9]{1,25})?([eE][+-]?[0-9]{1,2})?",
            "-?(0|[1-9][0-9]{0,5})(\\.[0-9]{1,5})?[eE][+-]?[1-3][0-9]{2}",
        ]
    }

    /// Number-like texts, most of them not JSON.
    fn junk_number() -> impl Strategy<Value = String> {
        "[-+.eE0-9]{1,12}"
    }

    /// A member's value text: mostly numbers, sometimes anything else.
    fn value_text() -> impl Strategy<Value = String> {
        prop_oneof![
            200 => number_text(),
            1 => junk_number(),
            1 => Just("true".to_string()),
            1 => Just("null".to_string()),
            1 => "\"[a-z é]{0,4}\"",
            1 => "\"[a-z\\\\\t\"]{0,4}\"",
            1 => "[\\[\\]{}tfnrue:,\" ]{1,3}",
        ]
    }

    fn member_name() -> impl Strategy<Value = String> {
        prop_oneof![
            120 => "[a-z_][a-z0-9_]{0,6}",
            1 => Just("ts".into()),
            1 => Just("device".into()),
            1 => "[a-z\\\\ 1\"]{1,3}",
        ]
    }

    /// A reading object's text: a device, a timestamp and fields, in any order; most of them
    /// valid.
    fn reading_text() -> impl Strategy<Value = String> {
        (
            prop_oneof![
                15 => Just(Some("truck_1".to_string())),
                3 => "truck_[0-9]{1,2}".prop_map(Some),
                1 => "[a-z ]{1,3}".prop_map(Some),
                3 => Just(None)
            ],
            prop_oneof![
                40 => (0i64..2_000_000_000_000).prop_map(|ms| Some(ms.to_string())),
                1 => number_text().prop_map(Some),
                1 => junk_number().prop_map(Some),
                1 => Just(Some("\"2024-01-01T00:00:00Z\"".to_string())),
                1 => Just(None),
            ],
            proptest::collection::vec((member_name(), value_text()), 1..5),
            any::<prop::sample::Index>(),
            "[ \n]{0,2}",
        )
            .prop_map(|(device, ts, mut members, at, space)| {
                if let Some(ts) = ts {
                    members.insert(at.index(members.len() + 1), ("ts".into(), ts));
                }
                if let Some(device) = device {
                    members.insert(at.index(members.len() + 1), ("device".into(), format!("\"{device}\"")));
                }
                let members: Vec<String> =
                    members.iter().map(|(name, value)| format!("{space}\"{name}\"{space}:{space}{value}")).collect();
                format!("{{{}}}", members.join(","))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Whatever the fast path reads, it reads as the general decoder does, to the bit.
        #[test]
        fn the_fast_path_agrees_with_the_general_decoder(
            readings in proptest::collection::vec(reading_text(), 0..3),
            array in any::<bool>(),
            topic_device in proptest::option::of(Just("truck_1".to_string())),
        ) {
            let payload = if array || readings.len() != 1 { format!("[{}]", readings.join(",")) } else { readings[0].clone() };
            let [decoded, general] = both(topic_device.as_deref(), &payload);
            prop_assert_eq!(decoded, general, "{}", payload);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// Numbers of every form read as `serde_json` reads them, or not at all.
        #[test]
        fn numbers_read_as_serde_json_reads_them(
            text in prop_oneof![number_text(), junk_number(), (-3_000_000_000_000i64..8_000_000_000_000).prop_map(|ms| ms.to_string())],
        ) {
            let mut scan = Scan { text: &text, src: text.as_bytes(), at: 0 };
            let number = scan.number().filter(|_| scan.at == text.len());
            // What the grammar allows, and only that, is a number (`1e400` too, which
            // `serde_json` then finds out of range).
            let theirs = match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(value) => {
                    prop_assert_eq!(number.is_some(), value.is_number(), "{}", text);
                    Some(value)
                }
                Err(e) => {
                    prop_assert!(number.is_none() || e.to_string().starts_with("number out of range"), "{}: {}", text, e);
                    None
                }
            };
            if let Some(ours) = number.as_ref().and_then(Number::value) {
                prop_assert_eq!(Some(ours.to_bits()), theirs.as_ref().and_then(serde_json::Value::as_f64).map(f64::to_bits), "{}", text);
            }
            // As field values: exactly what the general decoder makes of `serde_json`'s number.
            if let Some(ours) = number.as_ref().and_then(Number::field_value) {
                let bits = |v: Value| match v {
                    Value::F64(f) => (0, f.to_bits() as i64),
                    Value::UntypedInt(i) => (1, i),
                    other => panic!("a number read as {other:?}"),
                };
                let general = theirs.as_ref().and_then(serde_json::Value::as_number).and_then(super::super::number_value);
                prop_assert_eq!(Some(bits(ours)), general.map(bits), "{}", text);
            }
            if let Some(number) = number {
                prop_assert_eq!(number.millis(), ts_from_json_number(&text).ok(), "{}", text);
            }
        }
    }
}
