//! Answer formats: JSON (the default), CSV and Arrow IPC stream, chosen per request by
//! `format=json|csv|arrow` or else by the `Accept` header ([`Format::negotiate`]).
//!
//! Tabular answers (raw readings, latest values, roll-up rows) are first put in a [`Frame`]:
//! named, typed columns of one page. [`Frame::to_csv`] and [`Frame::to_arrow`] encode it; the
//! JSON shapes stay those of the API table in [`crate::api`]. How a field value becomes a cell
//! is decided in one place, [`FieldColumn`], so new value types (integers, booleans, strings)
//! only add variants there.
//!
//! CSV: a header line of column names, then one line per row, `,`-separated, `\n`-ended;
//! timestamps are epoch milliseconds, floats in the shortest form that reads back equal (with
//! an exponent from 1e16 and below 1e-5, as JSON writes them: `1e+300` is not 301 digits), a
//! missing value an empty cell; a text cell with `,`, `"` or a line break is quoted with `""`
//! for `"`.
//! Arrow: one schema and one record batch per answer; timestamps are
//! `Timestamp(Millisecond, "UTC")`, field values of their type (`Float64`, `Int64`, `Boolean`,
//! `Utf8`), every column nullable but [`REQUIRED_COLUMNS`] (unless [`Frame::nullable`] names
//! one), whatever a page holds: pages and devices concatenate.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use axum::http::{header, HeaderMap};

/// The columns that always hold a value (an Arrow field not nullable): the device of a row of
/// several devices', a reading's time, a roll-up row's period.
pub const REQUIRED_COLUMNS: [&str; 3] = ["device", "ts", "period"];

/// `Content-Type` of JSON answers.
pub const JSON: &str = "application/json";
/// `Content-Type` of CSV answers.
pub const CSV: &str = "text/csv; charset=utf-8";
/// `Content-Type` of Arrow IPC stream answers.
pub const ARROW: &str = "application/vnd.apache.arrow.stream";

/// The format of one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json`.
    Json,
    /// `text/csv`.
    Csv,
    /// `application/vnd.apache.arrow.stream`.
    Arrow,
}

impl Format {
    /// `format=` wins when given (`json`, `csv` or `arrow`; anything else is an error naming
    /// the choices); else the media type of `Accept` that names a format (`text/csv`,
    /// `application/vnd.apache.arrow.stream`, `application/json`) with the highest quality
    /// (`q`, 1 when not given; the first of equal ones; none with `q=0` or a weight that is no
    /// number from 0 to 1, which refuse it: QA34 F5, QA36 F5); else JSON (also when every type
    /// named is refused: the default, not a 406) — so `*/*`, a browser's `text/html,...` or no header get JSON.
    pub fn negotiate(param: Option<&str>, headers: &HeaderMap) -> Result<Format, String> {
        if let Some(p) = param {
            return match p {
                "json" => Ok(Format::Json),
                "csv" => Ok(Format::Csv),
                "arrow" => Ok(Format::Arrow),
                other => Err(format!("parameter `format`: {other:?} is not one of \"json\", \"csv\", \"arrow\"")),
            };
        }
        let accept = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok());
        let mut best: Option<(f32, Format)> = None;
        for media in accept.flat_map(|v| v.split(',')) {
            let mut parts = media.split(';');
            let essence = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            let format = match essence.as_str() {
                "text/csv" => Format::Csv,
                "application/vnd.apache.arrow.stream" => Format::Arrow,
                "application/json" => Format::Json,
                _ => continue,
            };
            /// A weight's value: the parameter's name is case-insensitive (RFC 9110 §12.4.2),
            /// spaces around `=` passed over.
            fn weight(param: &str) -> Option<&str> {
                let (name, value) = param.split_once('=')?;
                name.trim().eq_ignore_ascii_case("q").then_some(value.trim())
            }
            // A weight that is no number from 0 to 1 (`q=2`, `q=inf`) refuses the type, as `q=0`.
            let q = parts
                .find_map(weight)
                .map_or(Some(1.0), |q| q.parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q)))
                .unwrap_or(0.0);
            if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
                best = Some((q, format));
            }
        }
        Ok(best.map_or(Format::Json, |(_, f)| f))
    }

    /// The `Content-Type` of answers in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => JSON,
            Format::Csv => CSV,
            Format::Arrow => ARROW,
        }
    }
}

/// The cells of one column.
#[derive(Debug, Clone, PartialEq)]
pub enum Cells {
    /// Epoch milliseconds, UTC.
    Timestamp(Vec<Option<i64>>),
    /// Signed whole numbers.
    Int(Vec<Option<i64>>),
    /// Unsigned whole numbers (counts).
    UInt(Vec<Option<u64>>),
    /// Floating-point numbers.
    Float(Vec<Option<f64>>),
    /// Text (never null).
    Text(Vec<String>),
    /// Booleans.
    Bool(Vec<Option<bool>>),
    /// Text that may be missing (string fields).
    NullableText(Vec<Option<String>>),
}

impl Cells {
    fn len(&self) -> usize {
        match self {
            Cells::Timestamp(v) | Cells::Int(v) => v.len(),
            Cells::UInt(v) => v.len(),
            Cells::Float(v) => v.len(),
            Cells::Text(v) => v.len(),
            Cells::Bool(v) => v.len(),
            Cells::NullableText(v) => v.len(),
        }
    }

    fn data_type(&self) -> DataType {
        match self {
            Cells::Timestamp(_) => DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            Cells::Int(_) => DataType::Int64,
            Cells::UInt(_) => DataType::UInt64,
            Cells::Float(_) => DataType::Float64,
            Cells::Text(_) | Cells::NullableText(_) => DataType::Utf8,
            Cells::Bool(_) => DataType::Boolean,
        }
    }

    fn array(self) -> ArrayRef {
        match self {
            Cells::Timestamp(v) => Arc::new(TimestampMillisecondArray::from(v).with_timezone("UTC")),
            Cells::Int(v) => Arc::new(Int64Array::from(v)),
            Cells::UInt(v) => Arc::new(UInt64Array::from(v)),
            // Not finite (a roll-up sum past f64, and its mean): null, as JSON and CSV write it.
            Cells::Float(v) => Arc::new(v.into_iter().map(|x| x.filter(|x| x.is_finite())).collect::<Float64Array>()),
            Cells::Text(v) => Arc::new(StringArray::from(v)),
            Cells::Bool(v) => Arc::new(BooleanArray::from(v)),
            Cells::NullableText(v) => Arc::new(StringArray::from(v)),
        }
    }

    fn write_csv(&self, row: usize, out: &mut String) {
        use std::fmt::Write;
        let _ = match self {
            Cells::Timestamp(v) | Cells::Int(v) => v[row].map_or(Ok(()), |x| write!(out, "{x}")),
            Cells::UInt(v) => v[row].map_or(Ok(()), |x| write!(out, "{x}")),
            Cells::Float(v) => v[row].filter(|x| x.is_finite()).map_or(Ok(()), |x| {
                // Display never writes an exponent; JSON's form (ryu's, through serde_json)
                // does for the very large and very small.
                if x != 0.0 && !(1e-5..1e16).contains(&x.abs()) {
                    write!(out, "{}", serde_json::Value::from(x))
                } else {
                    write!(out, "{x}")
                }
            }),
            Cells::Text(v) => {
                csv_text(&v[row], out);
                Ok(())
            }
            Cells::Bool(v) => v[row].map_or(Ok(()), |x| write!(out, "{x}")),
            Cells::NullableText(v) => {
                if let Some(text) = &v[row] {
                    csv_text(text, out);
                }
                Ok(())
            }
        };
    }
}

fn csv_text(s: &str, out: &mut String) {
    if s.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&s.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(s);
    }
}

/// One page of a tabular answer: named columns of equal length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Frame {
    /// Columns in answer order.
    pub columns: Vec<(String, Cells)>,
    /// Columns of [`REQUIRED_COLUMNS`] that answers of this kind may leave empty (the `ts` of
    /// latest values, null for a device without a reading): nullable in every such answer.
    pub nullable: Vec<&'static str>,
}

impl Frame {
    /// Adds a column.
    pub fn push(&mut self, name: impl Into<String>, cells: Cells) {
        self.columns.push((name.into(), cells));
    }

    fn rows(&self) -> usize {
        self.columns.first().map_or(0, |(_, c)| c.len())
    }

    /// The frame as CSV (see the module doc).
    pub fn to_csv(&self) -> String {
        let mut out = String::new();
        for (i, (name, _)) in self.columns.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            csv_text(name, &mut out);
        }
        out.push('\n');
        for row in 0..self.rows() {
            for (i, (_, cells)) in self.columns.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                cells.write_csv(row, &mut out);
            }
            out.push('\n');
        }
        out
    }

    /// The frame as an Arrow IPC stream: its schema and one record batch.
    pub fn to_arrow(self) -> Result<Vec<u8>, String> {
        let fields: Vec<Field> = self
            .columns
            .iter()
            .map(|(name, c)| {
                let nullable = !REQUIRED_COLUMNS.contains(&name.as_str()) || self.nullable.contains(&name.as_str());
                Field::new(name.clone(), c.data_type(), nullable)
            })
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let arrays: Vec<ArrayRef> = self.columns.into_iter().map(|(_, c)| c.array()).collect();
        let batch = if arrays.is_empty() {
            RecordBatch::new_empty(schema.clone())
        } else {
            RecordBatch::try_new(schema.clone(), arrays).map_err(|e| format!("building the Arrow batch: {e}"))?
        };
        let mut out = Vec::new();
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut out, &schema)
            .map_err(|e| format!("writing the Arrow schema: {e}"))?;
        writer.write(&batch).map_err(|e| format!("writing the Arrow batch: {e}"))?;
        writer.finish().map_err(|e| format!("ending the Arrow stream: {e}"))?;
        drop(writer);
        Ok(out)
    }
}

/// The column of one reading field, filled row by row: the one place where a field value
/// becomes a cell (CSV, Arrow) or a JSON value.
///
/// A table's schema gives a field one type, so a column is floats, integers, booleans or
/// strings. Data written before the table had a schema may hold a field as a float in some
/// buckets and as an integer in others: such a column is answered as floats (an integer as the
/// nearest `f64`); any other mix as text.
#[derive(Debug, Clone, Default)]
pub struct FieldColumn {
    values: Vec<Option<model::Value>>,
    /// The field's type in its table's schema, if known: the column's type when every value is
    /// of it, a column without values included.
    ty: Option<model::FieldType>,
}

impl FieldColumn {
    /// A column of `rows` missing values, its type read from them.
    pub fn missing(rows: usize) -> FieldColumn {
        FieldColumn::typed(rows, None)
    }

    /// A column of `rows` missing values of a field of type `ty` (`None`: read from them).
    pub fn typed(rows: usize, ty: Option<model::FieldType>) -> FieldColumn {
        FieldColumn { values: vec![None; rows], ty }
    }

    /// Sets row `row` (which must exist).
    pub fn set(&mut self, row: usize, v: model::Value) {
        self.values[row] = Some(v);
    }

    /// The cells of the column (see the type's doc for the cell type).
    pub fn into_cells(self) -> Cells {
        use model::{FieldType, Value};
        let mut types = self.values.iter().flatten().map(Value::field_type);
        let first = match self.ty {
            Some(ty) => ty,
            None => types.next().unwrap_or(FieldType::F64),
        };
        let mut numeric = matches!(first, FieldType::F64 | FieldType::I64);
        let mut same = true;
        for t in types {
            same &= t == first;
            numeric &= matches!(t, FieldType::F64 | FieldType::I64);
        }
        let values = self.values;
        match first {
            FieldType::I64 if same => Cells::Int(
                values
                    .into_iter()
                    .map(|v| v.and_then(|v| if let Value::I64(i) = v { Some(i) } else { None }))
                    .collect(),
            ),
            FieldType::Bool if same => Cells::Bool(
                values
                    .into_iter()
                    .map(|v| v.and_then(|v| if let Value::Bool(b) = v { Some(b) } else { None }))
                    .collect(),
            ),
            _ if numeric => Cells::Float(values.into_iter().map(|v| v.and_then(|v| v.as_number())).collect()),
            _ => Cells::NullableText(
                values
                    .into_iter()
                    .map(|v| {
                        v.map(|v| match v {
                            Value::Str(s) => s.to_string(),
                            other => other.to_string(),
                        })
                    })
                    .collect(),
            ),
        }
    }
}

/// Appends a field value as JSON: a float in the shortest form that reads back equal (`null`
/// for the non-finite values ingest refuses), an integer exactly, a boolean, a string.
pub fn write_json_value(v: &model::Value, out: &mut Vec<u8>) {
    match v {
        // Writing a number to a Vec cannot fail.
        model::Value::F64(f) => {
            let _ = serde_json::to_writer(&mut *out, f);
        }
        model::Value::I64(i) | model::Value::UntypedInt(i) => {
            out.extend_from_slice(itoa::Buffer::new().format(*i).as_bytes())
        }
        model::Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        model::Value::Str(s) => write_json_str(s, out),
    }
}

/// Appends `s` as a JSON string.
pub fn write_json_str(s: &str, out: &mut Vec<u8>) {
    // Writing a &str to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use axum::http::HeaderValue;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn the_parameter_wins_then_the_known_accepted_type_of_highest_quality_then_json() {
        let none = HeaderMap::new();
        assert_eq!(Format::negotiate(None, &none), Ok(Format::Json));
        assert_eq!(Format::negotiate(None, &accept("text/csv")), Ok(Format::Csv));
        assert_eq!(
            Format::negotiate(None, &accept("text/html, application/vnd.apache.arrow.stream;q=0.9, text/csv")),
            Ok(Format::Csv)
        );
        assert_eq!(
            Format::negotiate(None, &accept("application/json;q=0.5, application/vnd.apache.arrow.stream;q=0.9")),
            Ok(Format::Arrow)
        );
        // The first of equal qualities; `q=0` refuses a type (QA34 F5).
        assert_eq!(Format::negotiate(None, &accept("text/csv;q=0.8, application/json; q=0.8")), Ok(Format::Csv));
        assert_eq!(
            Format::negotiate(None, &accept("application/vnd.apache.arrow.stream;q=0, application/json")),
            Ok(Format::Json)
        );
        assert_eq!(Format::negotiate(None, &accept("text/csv;q=0")), Ok(Format::Json));
        // The weight's name in either case.
        assert_eq!(Format::negotiate(None, &accept("text/csv;Q=0, application/json")), Ok(Format::Json));
        assert_eq!(Format::negotiate(None, &accept("application/json;Q=0.5, text/csv; Q=0.9")), Ok(Format::Csv));
        assert_eq!(Format::negotiate(None, &accept("text/csv;Q = 0, application/json")), Ok(Format::Json));
        // A weight out of range refuses its type (QA36 F5: `q=2` outranked `q=1`).
        assert_eq!(
            Format::negotiate(None, &accept("text/csv;q=2, application/vnd.apache.arrow.stream")),
            Ok(Format::Arrow)
        );
        assert_eq!(Format::negotiate(None, &accept("text/csv;q=inf")), Ok(Format::Json));
        assert_eq!(Format::negotiate(None, &accept("text/csv;q=1.0")), Ok(Format::Csv));
        assert_eq!(Format::negotiate(None, &accept("*/*")), Ok(Format::Json));
        assert_eq!(Format::negotiate(Some("csv"), &accept("application/json")), Ok(Format::Csv));
        assert_eq!(
            Format::negotiate(Some("xml"), &none),
            Err("parameter `format`: \"xml\" is not one of \"json\", \"csv\", \"arrow\"".into())
        );
    }

    #[test]
    fn csv_quotes_text_and_leaves_missing_cells_empty() {
        let mut f = Frame::default();
        f.push("device", Cells::Text(vec!["a,b".into(), "q\"x".into()]));
        f.push("ts", Cells::Timestamp(vec![Some(-1), None]));
        f.push("v", Cells::Float(vec![Some(0.1), None]));
        assert_eq!(f.to_csv(), "device,ts,v\n\"a,b\",-1,0.1\n\"q\"\"x\",,\n");
    }

    /// A column of `values` (`None`: the row lacks the field).
    fn column(values: Vec<Option<model::Value>>) -> Cells {
        let mut c = FieldColumn::missing(values.len());
        for (row, v) in values.into_iter().enumerate() {
            if let Some(v) = v {
                c.set(row, v);
            }
        }
        c.into_cells()
    }

    #[test]
    fn typed_field_columns_keep_their_type_in_csv_and_arrow() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Float64Type, Int64Type};
        use model::Value;
        let mut f = Frame::default();
        f.push("ts", Cells::Timestamp(vec![Some(1), Some(2), Some(3)]));
        f.push("count", column(vec![Some(Value::I64(-9_007_199_254_740_993)), None, Some(Value::I64(7))]));
        f.push("on", column(vec![Some(Value::Bool(true)), Some(Value::Bool(false)), None]));
        f.push("driver", column(vec![None, Some(Value::from("Seth, \"jr\"")), Some(Value::from("Ann"))]));
        // Old data: a field stored as a float before its table had a schema, an integer after.
        f.push("load", column(vec![Some(Value::F64(1.5)), Some(Value::I64(2)), None]));
        // Nothing sensible in common: text.
        f.push("odd", column(vec![Some(Value::Bool(true)), Some(Value::I64(2)), None]));
        assert_eq!(
            f.to_csv(),
            "ts,count,on,driver,load,odd\n\
             1,-9007199254740993,true,,1.5,true\n\
             2,,false,\"Seth, \"\"jr\"\"\",2,2\n\
             3,7,,Ann,,\n"
        );

        let bytes = f.to_arrow().unwrap();
        let mut reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        let batch = reader.next().unwrap().unwrap();
        let schema = batch.schema();
        let types: Vec<(&str, &DataType)> =
            schema.fields().iter().map(|f| (f.name().as_str(), f.data_type())).collect();
        assert_eq!(
            types[1..],
            [
                ("count", &DataType::Int64),
                ("on", &DataType::Boolean),
                ("driver", &DataType::Utf8),
                ("load", &DataType::Float64),
                ("odd", &DataType::Utf8)
            ]
        );
        let count = batch.column(1).as_primitive::<Int64Type>();
        assert_eq!(count.iter().collect::<Vec<_>>(), [Some(-9_007_199_254_740_993), None, Some(7)]);
        let on = batch.column(2).as_boolean();
        assert_eq!(on.iter().collect::<Vec<_>>(), [Some(true), Some(false), None]);
        let driver = batch.column(3).as_string::<i32>();
        assert_eq!(driver.iter().collect::<Vec<_>>(), [None, Some("Seth, \"jr\""), Some("Ann")]);
        let load = batch.column(4).as_primitive::<Float64Type>();
        assert_eq!(load.iter().collect::<Vec<_>>(), [Some(1.5), Some(2.0), None]);
    }

    /// Every column but the required ones is nullable, whatever the page holds: pages of one
    /// device concatenate with those that lack a value.
    #[test]
    fn arrow_nullability_is_the_columns_not_the_pages() {
        let mut f = Frame::default();
        f.push("device", Cells::Text(vec!["a".into()]));
        f.push("ts", Cells::Timestamp(vec![Some(1)]));
        f.push("v", Cells::Float(vec![Some(1.5)]));
        f.push("n", Cells::Int(vec![Some(2)]));
        let bytes = f.to_arrow().unwrap();
        let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        let nullable: Vec<(String, bool)> =
            reader.schema().fields().iter().map(|f| (f.name().clone(), f.is_nullable())).collect();
        assert_eq!(nullable, [("device".into(), false), ("ts".into(), false), ("v".into(), true), ("n".into(), true)]);
    }

    /// A number past f64 (a roll-up sum that overflowed, and its mean) is null in every format.
    #[test]
    fn non_finite_floats_are_null_in_csv_and_arrow() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::Float64Type;
        let mut f = Frame::default();
        f.push("v", Cells::Float(vec![Some(f64::INFINITY), Some(f64::NEG_INFINITY), Some(f64::NAN), Some(-0.5), None]));
        assert_eq!(f.to_csv(), "v\n\n\n\n-0.5\n\n");
        let bytes = f.to_arrow().unwrap();
        let mut reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        let batch = reader.next().unwrap().unwrap();
        let v = batch.column(0).as_primitive::<Float64Type>();
        assert_eq!(v.iter().collect::<Vec<_>>(), [None, None, None, Some(-0.5), None]);
    }

    #[test]
    fn csv_floats_take_an_exponent_only_when_very_large_or_small() {
        let mut f = Frame::default();
        let values = [1e300, 5e-324, -2.5e16, 1e16, 9.9e15, 1.0, 0.0, -0.00001, 0.000001, 21.5];
        f.push("v", Cells::Float(values.iter().map(|&v| Some(v)).collect()));
        assert_eq!(f.to_csv(), "v\n1e+300\n5e-324\n-2.5e+16\n1e+16\n9900000000000000\n1\n0\n-0.00001\n1e-6\n21.5\n");
        // Each reads back equal.
        for (line, want) in f.to_csv().lines().skip(1).zip(values) {
            assert_eq!(line.parse::<f64>().unwrap(), want, "{line}");
        }
    }

    #[test]
    fn json_values_are_typed() {
        use model::Value;
        let mut out = Vec::new();
        for v in [Value::F64(0.1), Value::F64(f64::NAN), Value::I64(i64::MIN), Value::Bool(false), Value::from("a\"b")]
        {
            write_json_value(&v, &mut out);
            out.push(b' ');
        }
        assert_eq!(String::from_utf8(out).unwrap(), "0.1 null -9223372036854775808 false \"a\\\"b\" ");
    }
}
