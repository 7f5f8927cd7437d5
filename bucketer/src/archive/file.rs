//! One archive file: the Parquet bytes of one partition of one table, written and read.
//!
//! Columns: `device` (UTF-8, not null), `ts` (timestamp in milliseconds, UTC, not null), then
//! one nullable column per field of the table's schema in name order, typed by the field:
//! f64 → DOUBLE, i64 → INT64, bool → BOOLEAN, string → UTF-8. A reading without a field has a
//! null there. Rows are sorted by device name, then time, one row per (device, ts); the file
//! says so in its sorting columns. Pages are zstd-compressed; `device` is dictionary-encoded
//! (a device's name repeats for all its rows), `ts` and integer fields are delta-encoded, and
//! every column keeps page-level statistics (column and offset indexes), so a reader skips
//! row groups and pages that cannot hold a device or a time range.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampMillisecondType};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};
use model::{FieldName, FieldType, Reading, TimeRange, Value};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::{PageIndexPolicy, SortingColumn};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnPath;

use crate::schema::Schema;

/// Name of the device column.
pub const DEVICE_COLUMN: &str = "device";
/// Name of the time column.
pub const TS_COLUMN: &str = "ts";

/// Rows handed to the Parquet writer at a time.
const BATCH_ROWS: usize = 8192;

/// What can go wrong with an archive file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The Parquet library refused.
    #[error("{path}: {source}")]
    Parquet {
        /// The file.
        path: String,
        /// Its error.
        source: parquet::errors::ParquetError,
    },
    /// The data does not fit the file's columns, or the file is not an archive file.
    #[error("{path}: {detail}")]
    Shape {
        /// The file.
        path: String,
        /// What does not fit.
        detail: String,
    },
}

fn shape(path: &Path, detail: impl Into<String>) -> FileError {
    FileError::Shape { path: path.display().to_string(), detail: detail.into() }
}

fn pq(path: &Path) -> impl FnOnce(parquet::errors::ParquetError) -> FileError + '_ {
    move |source| FileError::Parquet { path: path.display().to_string(), source }
}

fn arrow_err(path: &Path) -> impl FnOnce(arrow_schema::ArrowError) -> FileError + '_ {
    move |e| shape(path, e.to_string())
}

/// Settings of the files written.
#[derive(Debug, Clone, Copy)]
pub struct FileSettings {
    /// Rows per row group (the unit a reader prunes by statistics).
    pub row_group_rows: usize,
    /// zstd level of the pages.
    pub zstd_level: i32,
}

fn arrow_type(ty: FieldType) -> DataType {
    match ty {
        FieldType::F64 => DataType::Float64,
        FieldType::I64 => DataType::Int64,
        FieldType::Bool => DataType::Boolean,
        FieldType::Str => DataType::Utf8,
    }
}

/// The Arrow schema of a file holding the fields of `schema`.
pub fn arrow_schema(schema: &Schema) -> SchemaRef {
    let mut fields = vec![
        Field::new(DEVICE_COLUMN, DataType::Utf8, false),
        Field::new(TS_COLUMN, DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
    ];
    fields.extend(schema.fields.iter().map(|f| Field::new(f.name.as_ref(), arrow_type(f.ty), true)));
    Arc::new(ArrowSchema::new(fields))
}

enum Column {
    F64(Float64Builder),
    I64(Int64Builder),
    Bool(BooleanBuilder),
    Str(StringBuilder),
}

impl Column {
    fn new(ty: FieldType) -> Column {
        match ty {
            FieldType::F64 => Column::F64(Float64Builder::with_capacity(BATCH_ROWS)),
            FieldType::I64 => Column::I64(Int64Builder::with_capacity(BATCH_ROWS)),
            FieldType::Bool => Column::Bool(BooleanBuilder::with_capacity(BATCH_ROWS)),
            FieldType::Str => Column::Str(StringBuilder::new()),
        }
    }

    /// Appends `v` (or a null); `false` when its type is not the column's.
    fn push(&mut self, v: Option<&Value>) -> bool {
        match (self, v) {
            (Column::F64(b), Some(Value::F64(x))) => b.append_value(*x),
            (Column::I64(b), Some(Value::I64(x))) => b.append_value(*x),
            (Column::Bool(b), Some(Value::Bool(x))) => b.append_value(*x),
            (Column::Str(b), Some(Value::Str(x))) => b.append_value(x),
            (Column::F64(b), None) => b.append_null(),
            (Column::I64(b), None) => b.append_null(),
            (Column::Bool(b), None) => b.append_null(),
            (Column::Str(b), None) => b.append_null(),
            _ => return false,
        }
        true
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Column::F64(b) => Arc::new(b.finish()),
            Column::I64(b) => Arc::new(b.finish()),
            Column::Bool(b) => Arc::new(b.finish()),
            Column::Str(b) => Arc::new(b.finish()),
        }
    }
}

/// Writes one archive file, device by device in name order.
pub struct PartWriter<'p> {
    path: &'p Path,
    writer: ArrowWriter<File>,
    schema: SchemaRef,
    names: Vec<FieldName>,
    devices: StringBuilder,
    ts: TimestampMillisecondBuilder,
    columns: Vec<Column>,
    buffered: usize,
    /// Rows written so far, and the smallest and largest time among them.
    pub rows: u64,
    /// Smallest time written (`i64::MAX` before the first row).
    pub min_ts: i64,
    /// Largest time written (`i64::MIN` before the first row).
    pub max_ts: i64,
    last_device: Option<String>,
}

impl std::fmt::Debug for PartWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartWriter").field("path", &self.path).field("rows", &self.rows).finish()
    }
}

impl<'p> PartWriter<'p> {
    /// Creates `path` (truncating it) for the fields of `schema`.
    pub fn create(path: &'p Path, schema: &Schema, settings: FileSettings) -> Result<PartWriter<'p>, FileError> {
        for reserved in [DEVICE_COLUMN, TS_COLUMN] {
            if schema.field(reserved).is_some() {
                return Err(shape(
                    path,
                    format!("the table has a field named `{reserved}`, which is an archive key column"),
                ));
            }
        }
        let file = File::create(path).map_err(|source| FileError::Io { path: path.display().to_string(), source })?;
        let level = ZstdLevel::try_new(settings.zstd_level).map_err(pq(path))?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(level))
            .set_max_row_group_row_count(Some(settings.row_group_rows.max(1)))
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_sorting_columns(Some(vec![
                SortingColumn { column_idx: 0, descending: false, nulls_first: false },
                SortingColumn { column_idx: 1, descending: false, nulls_first: false },
            ]))
            .set_column_dictionary_enabled(ColumnPath::from(TS_COLUMN), false)
            .set_column_encoding(ColumnPath::from(TS_COLUMN), Encoding::DELTA_BINARY_PACKED);
        for f in &schema.fields {
            let col = ColumnPath::from(f.name.as_ref());
            props = match f.ty {
                FieldType::I64 => props
                    .set_column_dictionary_enabled(col.clone(), false)
                    .set_column_encoding(col, Encoding::DELTA_BINARY_PACKED),
                FieldType::F64 => props
                    .set_column_dictionary_enabled(col.clone(), false)
                    .set_column_encoding(col, Encoding::BYTE_STREAM_SPLIT),
                FieldType::Bool | FieldType::Str => props,
            };
        }
        let arrow = arrow_schema(schema);
        let writer = ArrowWriter::try_new(file, arrow.clone(), Some(props.build())).map_err(pq(path))?;
        Ok(PartWriter {
            path,
            writer,
            schema: arrow,
            names: schema.fields.iter().map(|f| f.name.clone()).collect(),
            devices: StringBuilder::new(),
            ts: TimestampMillisecondBuilder::with_capacity(BATCH_ROWS).with_timezone("UTC"),
            columns: schema.fields.iter().map(|f| Column::new(f.ty)).collect(),
            buffered: 0,
            rows: 0,
            min_ts: i64::MAX,
            max_ts: i64::MIN,
            last_device: None,
        })
    }

    /// Appends the readings of one device, sorted by time with one per timestamp. Devices come
    /// in ascending name order, each once.
    pub fn device(&mut self, device: &str, readings: &[Reading]) -> Result<(), FileError> {
        if let Some(last) = &self.last_device {
            if last.as_str() >= device {
                return Err(shape(self.path, format!("device `{device}` written after `{last}`")));
            }
        }
        self.last_device = Some(device.to_string());
        for r in readings {
            self.devices.append_value(device);
            self.ts.append_value(r.ts);
            self.min_ts = self.min_ts.min(r.ts);
            self.max_ts = self.max_ts.max(r.ts);
            // Both sorted by name: walk them together.
            let mut values = r.fields.iter().peekable();
            for (name, col) in self.names.iter().zip(self.columns.iter_mut()) {
                let v = match values.peek() {
                    Some((n, v)) if n == name => {
                        values.next();
                        Some(v)
                    }
                    _ => None,
                };
                if !col.push(v) {
                    return Err(shape(self.path, format!("device `{device}` has a value of another type in `{name}`")));
                }
            }
            if let Some((name, _)) = values.next() {
                return Err(shape(
                    self.path,
                    format!("device `{device}` has field `{name}`, which the table's schema lacks"),
                ));
            }
            self.buffered += 1;
            self.rows += 1;
            if self.buffered == BATCH_ROWS {
                self.flush_batch()?;
            }
        }
        Ok(())
    }

    fn flush_batch(&mut self) -> Result<(), FileError> {
        if self.buffered == 0 {
            return Ok(());
        }
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(self.devices.finish()), Arc::new(self.ts.finish())];
        arrays.extend(self.columns.iter_mut().map(Column::finish));
        let batch = RecordBatch::try_new(self.schema.clone(), arrays).map_err(arrow_err(self.path))?;
        self.writer.write(&batch).map_err(pq(self.path))?;
        self.buffered = 0;
        Ok(())
    }

    /// Writes the footer and fsyncs the file; returns its size in bytes.
    pub fn finish(mut self) -> Result<u64, FileError> {
        self.flush_batch()?;
        let file = self.writer.into_inner().map_err(pq(self.path))?;
        let io = |source| FileError::Io { path: self.path.display().to_string(), source };
        file.sync_all().map_err(io)?;
        Ok(file.metadata().map_err(io)?.len())
    }
}

/// Opens the metadata (footer and page indexes) of an archive file, for [`read_device`].
pub fn open_metadata(path: &Path) -> Result<ArrowReaderMetadata, FileError> {
    let file = File::open(path).map_err(|source| FileError::Io { path: path.display().to_string(), source })?;
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    ArrowReaderMetadata::load(&file, options).map_err(pq(path))
}

fn in_bytes_range(stats: Option<&Statistics>, device: &[u8]) -> bool {
    match stats {
        Some(s) => {
            s.min_bytes_opt().is_none_or(|min| min <= device) && s.max_bytes_opt().is_none_or(|max| device <= max)
        }
        None => true,
    }
}

fn overlaps_time(stats: Option<&Statistics>, range: TimeRange) -> bool {
    match stats {
        Some(Statistics::Int64(s)) => {
            s.min_opt().is_none_or(|&min| min < range.end) && s.max_opt().is_none_or(|&max| max >= range.start)
        }
        _ => true,
    }
}

/// The rows of the file whose metadata is `meta`, and the smallest and largest time in it by
/// its row groups' statistics (`None` when a row group has none).
pub fn rows_and_times(meta: &ArrowReaderMetadata) -> (u64, Option<(i64, i64)>) {
    let rows = u64::try_from(meta.metadata().file_metadata().num_rows()).unwrap_or(0);
    let Ok(ts_idx) = meta.schema().index_of(TS_COLUMN) else { return (rows, None) };
    let mut bounds: Option<(i64, i64)> = None;
    for rg in meta.metadata().row_groups() {
        let Some(Statistics::Int64(s)) = rg.column(ts_idx).statistics() else { return (rows, None) };
        let (Some(&min), Some(&max)) = (s.min_opt(), s.max_opt()) else { return (rows, None) };
        bounds = Some(bounds.map_or((min, max), |(lo, hi)| (lo.min(min), hi.max(max))));
    }
    (rows, bounds)
}

/// The rows of row group `rg` on the pages of column `col` that `keep` keeps (given the
/// column's page index and a page's number in it), in row order: every row when the file has
/// no page index for the column.
fn page_rows(
    meta: &ArrowReaderMetadata,
    rg: usize,
    col: usize,
    keep: impl Fn(&ColumnIndexMetaData, usize) -> bool,
) -> RowSelection {
    let rows = usize::try_from(meta.metadata().row_group(rg).num_rows()).unwrap_or(0);
    let index = meta.metadata().page_index_for_row_group(rg);
    let (Some(pages), Some(offsets)) = (index.column_index(col), index.offset_index(col)) else {
        return RowSelection::from(vec![RowSelector::select(rows)]);
    };
    let starts: Vec<usize> =
        offsets.page_locations().iter().map(|p| usize::try_from(p.first_row_index).unwrap_or(0)).collect();
    if u64::try_from(starts.len()).ok() != Some(pages.num_pages()) || starts.windows(2).any(|w| w[0] > w[1]) {
        return RowSelection::from(vec![RowSelector::select(rows)]);
    }
    let ranges = (0..starts.len())
        .filter(|&p| keep(pages, p))
        .map(|p| starts[p].min(rows)..starts.get(p + 1).copied().unwrap_or(rows).min(rows));
    RowSelection::from_consecutive_ranges(ranges, rows)
}

/// Whether page `p` of the device column may hold `device`, by its bounds.
fn page_may_hold_device(pages: &ColumnIndexMetaData, p: usize, device: &[u8]) -> bool {
    match pages {
        ColumnIndexMetaData::BYTE_ARRAY(ix) => {
            ix.min_value(p).is_none_or(|min| min <= device) && ix.max_value(p).is_none_or(|max| device <= max)
        }
        _ => true,
    }
}

/// Whether page `p` of the time column may hold a time within `range`, by its bounds.
fn page_may_overlap(pages: &ColumnIndexMetaData, p: usize, range: TimeRange) -> bool {
    match pages {
        ColumnIndexMetaData::INT64(ix) => {
            ix.min_value(p).is_none_or(|&min| min < range.end) && ix.max_value(p).is_none_or(|&max| max >= range.start)
        }
        _ => true,
    }
}

/// The readings of `device` within `range` in the file at `path` (whose metadata is `meta`),
/// in time order. Row groups whose statistics rule the device or the range out are not read,
/// nor, of the others, the rows on pages whose bounds in the page index rule them out (a page
/// of `device` or of `ts`); of the rows left, the `device` and `ts` columns are read first and
/// the rest only for the device's rows within the range (pages holding none of them are
/// skipped through the offset index).
pub fn read_device(
    path: &Path,
    meta: &ArrowReaderMetadata,
    device: &str,
    range: TimeRange,
) -> Result<Vec<Reading>, FileError> {
    let schema = meta.schema().clone();
    let (dev_idx, ts_idx) = (column_index(path, &schema, DEVICE_COLUMN)?, column_index(path, &schema, TS_COLUMN)?);
    let groups: Vec<usize> = meta
        .metadata()
        .row_groups()
        .iter()
        .enumerate()
        .filter(|(_, rg)| {
            in_bytes_range(rg.column(dev_idx).statistics(), device.as_bytes())
                && overlaps_time(rg.column(ts_idx).statistics(), range)
        })
        .map(|(i, _)| i)
        .collect();
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    let candidates: RowSelection = groups
        .iter()
        .map(|&rg| {
            page_rows(meta, rg, dev_idx, |pages, p| page_may_hold_device(pages, p, device.as_bytes()))
                .intersection(&page_rows(meta, rg, ts_idx, |pages, p| page_may_overlap(pages, p, range)))
        })
        .collect();
    if !candidates.selects_any() {
        return Ok(Vec::new());
    }
    let open = || File::open(path).map_err(|source| FileError::Io { path: path.display().to_string(), source });
    // Pass 1: where the device's rows within the range are among the candidates, from its
    // column and the time's.
    let mask = ProjectionMask::roots(meta.parquet_schema(), [dev_idx, ts_idx]);
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(open()?, meta.clone())
        .with_row_groups(groups.clone())
        .with_row_selection(candidates.clone())
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(pq(path))?;
    let mut selectors: Vec<RowSelector> = Vec::new();
    let mut push = |skip: bool, n: usize| match selectors.last_mut() {
        Some(last) if last.skip == skip => last.row_count += n,
        _ => selectors.push(if skip { RowSelector::skip(n) } else { RowSelector::select(n) }),
    };
    let mut any = false;
    for batch in reader {
        let batch = batch.map_err(arrow_err(path))?;
        let names = batch
            .column_by_name(DEVICE_COLUMN)
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(|| shape(path, "`device` is not UTF-8"))?;
        let ts = batch
            .column_by_name(TS_COLUMN)
            .and_then(|c| c.as_primitive_opt::<TimestampMillisecondType>())
            .ok_or_else(|| shape(path, "`ts` is not a millisecond timestamp"))?;
        for i in 0..names.len() {
            let hit = names.value(i) == device && range.contains(ts.value(i));
            any |= hit;
            push(!hit, 1);
        }
    }
    if !any {
        return Ok(Vec::new());
    }
    // Pass 2: every column, those rows only.
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(open()?, meta.clone())
        .with_row_groups(groups)
        .with_row_selection(candidates.and_then(&RowSelection::from(selectors)))
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(pq(path))?;
    let fields = field_names(&schema);
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(arrow_err(path))?;
        batch_readings(path, &batch, &fields, |_, r| out.push(r))?;
    }
    Ok(out)
}

fn column_index(path: &Path, schema: &SchemaRef, name: &str) -> Result<usize, FileError> {
    schema.index_of(name).map_err(|_| shape(path, format!("no `{name}` column")))
}

/// The field columns' names (every column after `device` and `ts`).
fn field_names(schema: &SchemaRef) -> Vec<FieldName> {
    schema.fields().iter().skip(2).map(|f| FieldName::from(f.name().as_str())).collect()
}

/// Hands each row of `batch` (columns as [`arrow_schema`] makes them) to `row` as (device,
/// reading).
fn batch_readings(
    path: &Path,
    batch: &RecordBatch,
    fields: &[FieldName],
    mut row: impl FnMut(&str, Reading),
) -> Result<(), FileError> {
    let devices = batch.column(0).as_string_opt::<i32>().ok_or_else(|| shape(path, "`device` is not UTF-8"))?;
    let ts = batch
        .column(1)
        .as_primitive_opt::<TimestampMillisecondType>()
        .ok_or_else(|| shape(path, "`ts` is not a millisecond timestamp"))?;
    let columns: Vec<&ArrayRef> = batch.columns()[2..].iter().collect();
    for i in 0..batch.num_rows() {
        let mut values = Vec::with_capacity(columns.len());
        for (name, col) in fields.iter().zip(&columns) {
            if col.is_null(i) {
                continue;
            }
            let v = match col.data_type() {
                DataType::Float64 => Value::F64(col.as_primitive::<Float64Type>().value(i)),
                DataType::Int64 => Value::I64(col.as_primitive::<Int64Type>().value(i)),
                DataType::Boolean => Value::Bool(col.as_boolean().value(i)),
                DataType::Utf8 => Value::Str(Arc::from(col.as_string::<i32>().value(i))),
                other => return Err(shape(path, format!("column `{name}` has type {other}"))),
            };
            values.push((name.clone(), v));
        }
        row(devices.value(i), Reading { ts: ts.value(i), fields: values });
    }
    Ok(())
}

/// A device's name and its readings, in time order.
pub type DeviceReadings = (Arc<str>, Vec<Reading>);

/// Reads a whole archive file in its order, one device at a time (for merging a partition's
/// new readings into it).
pub struct DeviceRows {
    path: std::path::PathBuf,
    reader: ParquetRecordBatchReader,
    fields: Vec<FieldName>,
    /// Rows decoded and not yet handed out, in file order.
    pending: std::collections::VecDeque<(Arc<str>, Reading)>,
}

impl std::fmt::Debug for DeviceRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRows").field("path", &self.path).finish()
    }
}

impl DeviceRows {
    /// Opens `path` for reading from its first row.
    pub fn open(path: &Path) -> Result<DeviceRows, FileError> {
        let file = File::open(path).map_err(|source| FileError::Io { path: path.display().to_string(), source })?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(pq(path))?;
        let schema = builder.schema().clone();
        for (i, name) in [DEVICE_COLUMN, TS_COLUMN].into_iter().enumerate() {
            if schema.fields().get(i).is_none_or(|f| f.name() != name) {
                return Err(shape(path, format!("column {i} is not `{name}`")));
            }
        }
        let reader = builder.with_batch_size(BATCH_ROWS).build().map_err(pq(path))?;
        Ok(DeviceRows {
            path: path.to_path_buf(),
            reader,
            fields: field_names(&schema),
            pending: std::collections::VecDeque::new(),
        })
    }

    fn fill(&mut self) -> Result<bool, FileError> {
        while self.pending.is_empty() {
            let Some(batch) = self.reader.next() else { return Ok(false) };
            let batch = batch.map_err(arrow_err(&self.path))?;
            let mut last: Option<Arc<str>> = None;
            let pending = &mut self.pending;
            batch_readings(&self.path, &batch, &self.fields, |d, r| {
                let name = match &last {
                    Some(n) if n.as_ref() == d => n.clone(),
                    _ => Arc::from(d),
                };
                last = Some(name.clone());
                pending.push_back((name, r));
            })?;
        }
        Ok(true)
    }

    /// The name of the next device, if any rows are left.
    pub fn peek_device(&mut self) -> Result<Option<Arc<str>>, FileError> {
        Ok(if self.fill()? { self.pending.front().map(|(d, _)| d.clone()) } else { None })
    }

    /// All rows of the next device, in time order.
    pub fn next_device(&mut self) -> Result<Option<DeviceReadings>, FileError> {
        let Some(device) = self.peek_device()? else { return Ok(None) };
        let mut rows = Vec::new();
        while self.fill()? {
            match self.pending.front() {
                Some((d, _)) if *d == device => rows.extend(self.pending.pop_front().map(|(_, r)| r)),
                _ => break,
            }
        }
        Ok(Some((device, rows)))
    }
}
