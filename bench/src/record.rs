//! Recordings: a workload written to a compact file, replayed later without the generator.
//!
//! # Format, version 3
//!
//! All integers little-endian; `varint` is LEB128, `zigzag` maps signed to unsigned varints.
//!
//! | part | bytes |
//! |---|---|
//! | magic | `HGWL` |
//! | version | u16 = 3 |
//! | header length | u32 |
//! | header | JSON: `{"spec": WorkloadSpec}` |
//! | header check | u32 CRC-32 (IEEE) of the version's, the header length's and the header's bytes |
//! | frames | each: u32 payload length (> 0), u32 point count, u32 CRC-32 (IEEE) of the point count's four bytes and the payload, payload |
//! | end | u32 0, then u64 points in the file, u64 frames |
//!
//! Versions 2 and 1, read too, are the same without the header's CRC-32 (a digit damaged in the
//! header replays the workload at other times, or another fleet, unnoticed), and version 1
//! without the frames' too: a byte damaged inside a frame is then found only if it makes the
//! frame unreadable.
//!
//! A payload holds its points one after the other: u8 table code ([`TableKind::code`]),
//! varint device, varint tick, then one zigzag varint per field of the table (the scaled
//! integer, see [`crate::workload::FieldSpec::decimals`]). A frame is one batch of the
//! generator, in emission order, so a replay sends the same batches in the same order. A file
//! without its end marker is refused as truncated ([`RecordReader::open`]: before it is read).
//! About 14 to 17 bytes a point (measured from 100 to 10M trucks).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::workload::{Point, TableKind, WorkloadSpec, MAX_FIELDS};
use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"HGWL";
/// The format version this module writes; it reads every one from [`VERSION_NO_CRC`].
pub const VERSION: u16 = 3;
/// The version whose header has no CRC-32 (its frames have).
pub const VERSION_NO_HEADER_CRC: u16 = 2;
/// The first version, whose frames and header have no CRC-32.
pub const VERSION_NO_CRC: u16 = 1;
/// Bytes of the end marker: a zero frame length (u32), the points and the frames (u64 each).
const END_MARKER_LEN: usize = 20;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    spec: WorkloadSpec,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// The CRC-32 of a frame: of its point count's bytes, then its payload.
fn frame_crc(count: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&count.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends `p` to a frame payload.
fn encode_point(out: &mut Vec<u8>, p: &Point) {
    out.push(p.kind.code());
    put_varint(out, p.device);
    put_varint(out, p.tick);
    for &v in p.values() {
        put_varint(out, zigzag(v));
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Result<u8> {
        let b = *self.bytes.get(self.pos).ok_or_else(|| Error::Format("frame ends inside a point".into()))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(Error::Format("varint longer than 10 bytes".into()))
    }

    fn point(&mut self) -> Result<Point> {
        let code = self.byte()?;
        let kind = TableKind::from_code(code).ok_or_else(|| Error::Format(format!("unknown table code {code}")))?;
        let device = self.varint()?;
        let tick = self.varint()?;
        let mut values = [0i64; MAX_FIELDS];
        for v in values.iter_mut().take(kind.fields().len()) {
            *v = unzigzag(self.varint()?);
        }
        Ok(Point { kind, device, tick, values })
    }
}

/// Writes a recording, one frame per [`RecordWriter::write_frame`].
#[derive(Debug)]
pub struct RecordWriter<W: Write> {
    out: W,
    payload: Vec<u8>,
    points: u64,
    frames: u64,
}

impl<W: Write> RecordWriter<W> {
    /// Writes the header to `out`.
    pub fn new(mut out: W, spec: &WorkloadSpec) -> Result<Self> {
        let header = serde_json::to_vec(&Header { spec: spec.clone() }).map_err(|e| Error::Format(e.to_string()))?;
        let mut head = Vec::with_capacity(header.len() + 10);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&(header.len() as u32).to_le_bytes());
        head.extend_from_slice(&header);
        let check = crc32fast::hash(&head[MAGIC.len()..]);
        head.extend_from_slice(&check.to_le_bytes());
        out.write_all(&head).map_err(|e| Error::io("recording", e))?;
        Ok(RecordWriter { out, payload: Vec::new(), points: 0, frames: 0 })
    }

    /// Writes one frame holding `points` (nothing for an empty slice).
    pub fn write_frame(&mut self, points: &[Point]) -> Result<()> {
        if points.is_empty() {
            return Ok(());
        }
        self.payload.clear();
        for p in points {
            encode_point(&mut self.payload, p);
        }
        let len = u32::try_from(self.payload.len()).map_err(|_| Error::Format("frame over 4 GiB".into()))?;
        let count = points.len() as u32;
        self.out.write_all(&len.to_le_bytes()).map_err(|e| Error::io("recording", e))?;
        self.out.write_all(&count.to_le_bytes()).map_err(|e| Error::io("recording", e))?;
        self.out.write_all(&frame_crc(count, &self.payload).to_le_bytes()).map_err(|e| Error::io("recording", e))?;
        self.out.write_all(&self.payload).map_err(|e| Error::io("recording", e))?;
        self.points += points.len() as u64;
        self.frames += 1;
        Ok(())
    }

    /// Writes the end marker and flushes; returns the writer.
    pub fn finish(mut self) -> Result<W> {
        let mut end = Vec::with_capacity(END_MARKER_LEN);
        end.extend_from_slice(&0u32.to_le_bytes());
        end.extend_from_slice(&self.points.to_le_bytes());
        end.extend_from_slice(&self.frames.to_le_bytes());
        self.out.write_all(&end).map_err(|e| Error::io("recording", e))?;
        self.out.flush().map_err(|e| Error::io("recording", e))?;
        Ok(self.out)
    }
}

/// Reads a recording frame by frame.
#[derive(Debug)]
pub struct RecordReader<R: Read> {
    input: R,
    /// Whether frames carry a CRC-32 (version 2 on).
    checksums: bool,
    spec: WorkloadSpec,
    payload: Vec<u8>,
    points: u64,
    frames: u64,
    done: bool,
    origin: PathBuf,
    recorded: Option<u64>,
}

impl RecordReader<BufReader<File>> {
    /// Opens the file at `path`, reads its header and the point count of its end marker; a
    /// file without one is refused as truncated before any of it is read.
    pub fn open(path: &Path) -> Result<Self> {
        let mut file = File::open(path).map_err(|e| Error::io(path.display().to_string(), e))?;
        let recorded = end_marker_points(&mut file);
        file.seek(SeekFrom::Start(0)).map_err(|e| match e.kind() {
            // A pipe (`--file <(…)`): its end marker cannot be read before its frames.
            std::io::ErrorKind::NotSeekable => Error::Format(format!(
                "{}: not a file that can be read from its end (a pipe?): a recording is read from a regular file",
                path.display()
            )),
            _ => Error::io(path.display().to_string(), e),
        })?;
        let mut reader = RecordReader::new(BufReader::with_capacity(1 << 20, file), path)?;
        if recorded.is_none() {
            return Err(Error::Format(format!("{}: truncated (no end marker)", path.display())));
        }
        reader.recorded = recorded;
        Ok(reader)
    }
}

/// The point count of a recording's end marker (its last [`END_MARKER_LEN`] bytes); `None`
/// where the file cannot be read there or ends otherwise. Only a progress total: the count is
/// checked against the frames when the end is read.
fn end_marker_points(file: &mut File) -> Option<u64> {
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.checked_sub(END_MARKER_LEN as u64)?)).ok()?;
    let mut end = [0u8; END_MARKER_LEN];
    file.read_exact(&mut end).ok()?;
    (end[..4] == [0; 4]).then(|| u64::from_le_bytes(end[4..12].try_into().unwrap_or_default()))
}

/// The largest header a recording is read with: a workload's spec as JSON is a few hundred bytes.
const MAX_HEADER_BYTES: usize = 1 << 20;

impl<R: Read> RecordReader<R> {
    /// Reads the header from `input`; `origin` names it in errors.
    pub fn new(mut input: R, origin: &Path) -> Result<Self> {
        let name = origin.display().to_string();
        let mut head = [0u8; 10];
        input.read_exact(&mut head).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::Format(format!("{name}: too short to be a workload recording")),
            _ => Error::io(name.clone(), e),
        })?;
        if &head[..4] != MAGIC {
            return Err(Error::Format(format!("{name}: not a workload recording (no HGWL magic)")));
        }
        let version = u16::from_le_bytes([head[4], head[5]]);
        if !(VERSION_NO_CRC..=VERSION).contains(&version) {
            return Err(Error::Format(format!(
                "{name}: recording format version {version}; this build reads {VERSION_NO_CRC} to {VERSION}"
            )));
        }
        let len = u32::from_le_bytes([head[6], head[7], head[8], head[9]]) as usize;
        if len > MAX_HEADER_BYTES {
            return Err(Error::Format(format!("{name}: a header of {len} bytes (damaged: a header is a few hundred)")));
        }
        let checked = version >= VERSION;
        let mut header = vec![0u8; len + if checked { 4 } else { 0 }];
        input.read_exact(&mut header).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::Format(format!("{name}: truncated inside its header")),
            _ => Error::io(name.clone(), e),
        })?;
        if checked {
            let found = u32::from_le_bytes(header[len..].try_into().unwrap_or_default());
            header.truncate(len);
            let mut h = crc32fast::Hasher::new();
            h.update(&head[MAGIC.len()..]);
            h.update(&header);
            if h.finalize() != found {
                return Err(Error::Format(format!("{name}: the header is damaged (its CRC-32 does not match)")));
            }
        }
        let header: Header =
            serde_json::from_slice(&header).map_err(|e| Error::Format(format!("{name}: header: {e}")))?;
        header.spec.validate()?;
        Ok(RecordReader {
            input,
            checksums: version >= VERSION_NO_HEADER_CRC,
            spec: header.spec,
            payload: Vec::new(),
            points: 0,
            frames: 0,
            done: false,
            origin: origin.to_path_buf(),
            recorded: None,
        })
    }

    /// The recorded workload's spec.
    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// The points the recording's end marker counts, where the reader was opened on a file
    /// ([`RecordReader::open`]) that has one; unchecked until the end is read.
    pub fn recorded_points(&self) -> Option<u64> {
        self.recorded
    }

    fn read_u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        self.input.read_exact(&mut b).map_err(|e| self.truncated(e))?;
        Ok(u32::from_le_bytes(b))
    }

    fn read_u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.input.read_exact(&mut b).map_err(|e| self.truncated(e))?;
        Ok(u64::from_le_bytes(b))
    }

    fn truncated(&self, e: std::io::Error) -> Error {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Format(format!("{}: truncated (no end marker)", self.origin.display()))
        } else {
            Error::io(self.origin.display().to_string(), e)
        }
    }

    /// Replaces `out` with the next frame's points; false at the end marker (after checking
    /// the totals it carries).
    pub fn next_frame(&mut self, out: &mut Vec<Point>) -> Result<bool> {
        out.clear();
        if self.done {
            return Ok(false);
        }
        let len = self.read_u32()? as usize;
        if len == 0 {
            let (points, frames) = (self.read_u64()?, self.read_u64()?);
            if (points, frames) != (self.points, self.frames) {
                return Err(Error::Format(format!(
                    "{}: end marker says {points} points in {frames} frames, read {} in {}",
                    self.origin.display(),
                    self.points,
                    self.frames
                )));
            }
            self.done = true;
            return Ok(false);
        }
        let count = self.read_u32()?;
        let recorded_crc = if self.checksums { Some(self.read_u32()?) } else { None };
        self.payload.resize(len, 0);
        let mut payload = std::mem::take(&mut self.payload);
        let read = self.input.read_exact(&mut payload).map_err(|e| self.truncated(e));
        self.payload = payload;
        read?;
        if let Some(recorded) = recorded_crc {
            let found = frame_crc(count, &self.payload);
            if found != recorded {
                return Err(Error::Format(format!(
                    "{}: frame {} is damaged (its CRC-32 is {found:#010x}, {recorded:#010x} was recorded)",
                    self.origin.display(),
                    self.frames + 1
                )));
            }
        }
        let count = count as usize;
        let mut cursor = Cursor { bytes: &self.payload, pos: 0 };
        out.reserve(count);
        for _ in 0..count {
            out.push(cursor.point()?);
        }
        if cursor.pos != len {
            return Err(Error::Format(format!(
                "{}: frame has {} bytes after its points",
                self.origin.display(),
                len - cursor.pos
            )));
        }
        self.points += count as u64;
        self.frames += 1;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{point_state, Generator, PointState};

    #[test]
    fn varints_round_trip() {
        for v in [0i64, 1, -1, 63, -64, 64, 1 << 40, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            put_varint(&mut out, zigzag(v));
            let mut c = Cursor { bytes: &out, pos: 0 };
            assert_eq!(unzigzag(c.varint().expect("a varint")), v);
            assert_eq!(c.pos, out.len());
        }
    }

    /// A recording given as a pipe (`--file <(cat w.hgwl)`) is refused saying why (it was a
    /// bare "Illegal seek").
    #[test]
    fn a_pipe_is_refused_saying_why() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("w.hgwl");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(made.success());
        // Opening a FIFO for reading waits for a writer.
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).expect("the writer's end");
                let _ = std::io::Write::write_all(&mut w, b"HGWL");
            })
        };
        let Err(err) = RecordReader::open(&fifo) else { panic!("a pipe was read") };
        writer.join().expect("writer");
        assert_eq!(
            err.to_string(),
            format!(
                "recording: {}: not a file that can be read from its end (a pipe?): a recording is read from a \
                 regular file",
                fifo.display()
            )
        );
    }

    fn record(spec: &WorkloadSpec) -> (Vec<u8>, Vec<Vec<Point>>) {
        let mut g = Generator::new(spec.clone()).expect("valid");
        let mut w = RecordWriter::new(Vec::new(), spec).expect("header");
        let (mut frames, mut out) = (Vec::new(), Vec::new());
        while g.next_batch(333, &mut out) {
            w.write_frame(&out).expect("frame");
            frames.push(out.clone());
        }
        (w.finish().expect("end"), frames)
    }

    #[test]
    fn record_then_replay_is_exact_and_deterministic() {
        let spec = WorkloadSpec { devices: 120, ticks: 30, max_delay_ticks: 6, ..WorkloadSpec::default() };
        let (bytes, frames) = record(&spec);
        assert_eq!(record(&spec).0, bytes, "same seed, same bytes");
        assert_ne!(record(&WorkloadSpec { seed: 1, ..spec.clone() }).0, bytes);
        let mut r = RecordReader::new(&bytes[..], Path::new("mem")).expect("header");
        assert_eq!(r.spec(), &spec);
        let (mut read, mut out) = (Vec::new(), Vec::new());
        while r.next_frame(&mut out).expect("frame") {
            read.push(out.clone());
        }
        assert_eq!(read, frames);
        let points: usize = frames.iter().map(Vec::len).sum();
        assert!(bytes.len() < points * 24, "{} bytes for {points} points", bytes.len());
    }

    /// A recording opened as a file knows its point count before it is read (a progress
    /// total); a file cut short of its end marker does not, and still fails at its end.
    #[test]
    fn a_recording_file_gives_its_point_count_up_front() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let spec = WorkloadSpec { devices: 40, ticks: 12, ..WorkloadSpec::default() };
        let (bytes, frames) = record(&spec);
        let points = frames.iter().map(Vec::len).sum::<usize>();
        let kept = (0..spec.devices)
            .flat_map(|d| (0..spec.ticks).flat_map(move |t| TableKind::ALL.map(|k| (k, d, t))))
            .filter(|&(k, d, t)| point_state(&spec, k, d, t) != PointState::Missing)
            .count();
        assert_eq!((points, kept), (952, 952), "960 slots less this seed's 8 drops");
        let whole = dir.path().join("whole.hgwl");
        std::fs::write(&whole, &bytes).expect("written");
        let mut r = RecordReader::open(&whole).expect("opens");
        assert_eq!(r.recorded_points(), Some(952));
        let (mut read, mut out) = (0, Vec::new());
        while r.next_frame(&mut out).expect("a frame") {
            read += out.len();
        }
        assert_eq!(read, 952, "read from the start after the end marker was read");
        let cut = dir.path().join("cut.hgwl");
        std::fs::write(&cut, &bytes[..bytes.len() - 17]).expect("written");
        let err = RecordReader::open(&cut).map(|_| ()).expect_err("no end marker");
        assert_eq!(err.to_string(), format!("recording: {}: truncated (no end marker)", cut.display()));
        let tiny = dir.path().join("tiny.hgwl");
        std::fs::write(&tiny, &bytes[..12]).expect("written");
        assert!(RecordReader::open(&tiny).is_err(), "a header cut short is refused");
        assert_eq!(RecordReader::new(&bytes[..], Path::new("mem")).expect("header").recorded_points(), None);
    }

    /// `bytes` (version 3) as version 2 wrote them: the header without its CRC-32.
    fn as_version_2(bytes: &[u8]) -> Vec<u8> {
        let header_end = 10 + u32::from_le_bytes(bytes[6..10].try_into().expect("4 bytes")) as usize;
        let mut out = bytes[..header_end].to_vec();
        out[4..6].copy_from_slice(&VERSION_NO_HEADER_CRC.to_le_bytes());
        out.extend_from_slice(&bytes[header_end + 4..]);
        out
    }

    /// `bytes` (version 3) as version 1 wrote them: the header and the frames without their
    /// CRC-32.
    fn as_version_1(bytes: &[u8]) -> Vec<u8> {
        let bytes = as_version_2(bytes);
        let header_end = 10 + u32::from_le_bytes(bytes[6..10].try_into().expect("4 bytes")) as usize;
        let mut out = bytes[..header_end].to_vec();
        out[4..6].copy_from_slice(&VERSION_NO_CRC.to_le_bytes());
        let mut at = header_end;
        loop {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            if len == 0 {
                out.extend_from_slice(&bytes[at..]);
                return out;
            }
            out.extend_from_slice(&bytes[at..at + 8]);
            out.extend_from_slice(&bytes[at + 12..at + 12 + len]);
            at += 12 + len;
        }
    }

    fn read_all(bytes: &[u8], origin: &str) -> Result<Vec<Vec<Point>>> {
        let mut r = RecordReader::new(bytes, Path::new(origin))?;
        let (mut read, mut out) = (Vec::new(), Vec::new());
        while r.next_frame(&mut out)? {
            read.push(out.clone());
        }
        Ok(read)
    }

    /// A byte damaged inside a frame fails the read at that frame, named; a recording of
    /// version 1 (no CRC) still reads.
    #[test]
    fn a_damaged_frame_is_refused_and_version_1_still_reads() {
        let spec = WorkloadSpec { devices: 50, ticks: 10, ..WorkloadSpec::default() };
        let (bytes, frames) = record(&spec);
        assert!(frames.len() >= 3, "{} frames", frames.len());
        assert_eq!(read_all(&bytes, "w").expect("whole"), frames);
        // A field value's varint in the second frame's payload: the frame still decodes, to
        // another value, without its CRC.
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        // The header and its CRC-32.
        let header_end = 10 + u32_at(6) as usize + 4;
        let second = header_end + 12 + u32_at(header_end) as usize;
        let (second_len, recorded) = (u32_at(second) as usize, u32_at(second + 8));
        let at = second + 12 + 5;
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x01;
        let err = read_all(&damaged, "w").expect_err("damaged");
        let found = frame_crc(frames[1].len() as u32, &damaged[second + 12..second + 12 + second_len]);
        assert_ne!(found, recorded);
        assert_eq!(
            err.to_string(),
            format!("recording: w: frame 2 is damaged (its CRC-32 is {found:#010x}, {recorded:#010x} was recorded)")
        );
        let v1 = as_version_1(&bytes);
        assert_eq!(v1.len(), bytes.len() - 4 - 4 * frames.len());
        assert_eq!(read_all(&v1, "v1").expect("version 1"), frames);
        // Without a CRC the same damage reads as another workload.
        let mut damaged_v1 = v1.clone();
        damaged_v1[at - 8] ^= 0x01;
        let read = read_all(&damaged_v1, "v1").expect("read, unnoticed");
        assert_ne!(read, frames);
    }

    #[test]
    fn truncated_and_foreign_files_are_refused() {
        let spec = WorkloadSpec { devices: 5, ticks: 3, ..WorkloadSpec::default() };
        let (bytes, _) = record(&spec);
        let mut r = RecordReader::new(&bytes[..bytes.len() - 17], Path::new("cut")).expect("header");
        let mut out = Vec::new();
        let err = loop {
            match r.next_frame(&mut out) {
                Ok(true) => continue,
                Ok(false) => panic!("a truncated file read to its end"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("truncated"), "{err}");
        let err = RecordReader::new(&b"PK\x03\x04 not ours"[..], Path::new("zip")).expect_err("not a recording");
        assert!(err.to_string().contains("magic"), "{err}");
        // A digit of the header's start time damaged (2024-01-01T00:00:00 → 00:01:30): refused;
        // the same damage in a version 2 recording, which has no check of its header, passes.
        let start = b"\"start_ms\":1704067200000";
        let digit = bytes.windows(start.len()).position(|w| w == start).expect("the start in the header") + 19;
        let mut shifted = bytes.clone();
        shifted[digit] = b'9';
        let err = RecordReader::new(&shifted[..], Path::new("h")).expect_err("a damaged header");
        assert_eq!(err.to_string(), "recording: h: the header is damaged (its CRC-32 does not match)");
        let mut shifted_v2 = as_version_2(&bytes);
        shifted_v2[digit] = b'9';
        let read = RecordReader::new(&shifted_v2[..], Path::new("h2")).expect("read, unnoticed");
        assert_eq!(read.spec().start_ms, 1_704_067_290_000);
        assert_eq!(RecordReader::new(&as_version_2(&bytes)[..], Path::new("v2")).expect("v2").spec(), &spec);
        let mut future = bytes.clone();
        future[4] = 9;
        let err = RecordReader::new(&future[..], Path::new("v9")).expect_err("unknown version");
        assert!(err.to_string().contains("version 9"), "{err}");
        let err = RecordReader::new(&bytes[..12], Path::new("tiny")).expect_err("cut inside the header");
        assert_eq!(err.to_string(), "recording: tiny: truncated inside its header");
        let mut huge = bytes.clone();
        huge[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = RecordReader::new(&huge[..], Path::new("huge")).expect_err("a damaged header length");
        assert!(err.to_string().contains("a header of 4294967295 bytes (damaged"), "{err}");
    }
}
