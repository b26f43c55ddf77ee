//! The one record framing of the node's append-only files (the Raft log's WAL segments and
//! the claim journals): `[body length: u32 LE][CRC-32 of body: u32 LE][body]`.
//!
//! Reading stops at the first record that is not whole and intact, and says why
//! ([`Stop`]): the input ended on a record boundary, a zero length begins (a WAL segment is
//! made of zeros, so its records end there), or the record is torn or corrupt (cut short,
//! a length past the limit, a checksum that fails). A crash can only tear the last append,
//! which was never acknowledged (acknowledgements wait for the fsync); so each owner
//! decides what a stop means where it happened: the WAL cuts a torn tail of its last
//! segment and refuses one anywhere else, the journal drops its tail and compacts. Both
//! first ask [`is_torn_append`] whether the damage is what a crash leaves at all; a flipped
//! bit, or data after the damage, is not, and the file is refused.

use std::io::{self, Read};

/// Bytes of a record's header (length and checksum).
pub const HEADER_BYTES: usize = 8;

/// A record body too long for the `u32` length.
#[derive(Debug, thiserror::Error)]
#[error("a record of {len_bytes} bytes is too large to frame")]
pub struct TooLarge {
    pub len_bytes: usize,
}

/// Why reading stopped before a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The input ended exactly where a record would start.
    End,
    /// A zero length: a WAL segment's zeros, where nothing was written yet (in a file that
    /// is not made of zeros, a header that says no body).
    Zeros,
    /// The record here is torn or corrupt.
    Torn(String),
}

/// Appends one record to `out`, its body the concatenation of `parts`.
///
/// # Errors
/// When the body does not fit a `u32` length.
pub fn push(out: &mut Vec<u8>, parts: &[&[u8]]) -> Result<(), TooLarge> {
    let len_bytes: usize = parts.iter().map(|part| part.len()).sum();
    let len = u32::try_from(len_bytes).map_err(|_| TooLarge { len_bytes })?;
    let mut crc = crc32fast::Hasher::new();
    for part in parts {
        crc.update(part);
    }
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    for part in parts {
        out.extend_from_slice(part);
    }
    Ok(())
}

/// The length and checksum in `header`; `Err(Stop::Zeros)` for a zero length.
fn parse_header(header: &[u8; HEADER_BYTES], len_max: usize) -> Result<(usize, u32), Stop> {
    let [l0, l1, l2, l3, c0, c1, c2, c3] = *header;
    let len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
    if len == 0 {
        return Err(Stop::Zeros);
    }
    if len > len_max {
        return Err(Stop::Torn(format!("a record claims {len} bytes")));
    }
    Ok((len, u32::from_le_bytes([c0, c1, c2, c3])))
}

fn check(body: &[u8], crc: u32) -> Result<(), Stop> {
    if crc32fast::hash(body) == crc {
        Ok(())
    } else {
        Err(Stop::Torn("a record failed its checksum".to_owned()))
    }
}

/// The record at `at` of `bytes` (at most `len_max` bytes of body): its body and where
/// the next record starts.
///
/// # Errors
/// Why there is no whole, intact record at `at`.
pub fn read_at(bytes: &[u8], at: usize, len_max: usize) -> Result<(&[u8], usize), Stop> {
    let Some(rest) = bytes.get(at..).filter(|rest| !rest.is_empty()) else {
        return Err(Stop::End);
    };
    let Some(header) = rest.first_chunk::<HEADER_BYTES>() else {
        return Err(Stop::Torn("a record header was cut short".to_owned()));
    };
    let (len, crc) = parse_header(header, len_max)?;
    let Some(body) = rest.get(HEADER_BYTES..HEADER_BYTES + len) else {
        return Err(Stop::Torn("a record body was cut short".to_owned()));
    };
    check(body, crc)?;
    Ok((body, at + HEADER_BYTES + len))
}

/// The unit a disk writes whole. A crash that cuts a write short leaves it cut at a multiple
/// of this: past the cut the file reads as zeros (a WAL segment's, or blocks allocated but
/// never written) or ends.
pub const SECTOR_BYTES: u64 = 512;

/// Whether `tail`, everything from the first record that did not read (at `offset` in its
/// file) to the end of the file, is what a crash leaves of a last append: the write stopped
/// at a sector boundary inside that record and only zeros follow it, or the file ends
/// inside the record. Zeros alone are a write that never reached `offset`.
///
/// Anything else is damage no crash makes: data in a sector past the record, a record
/// whose every sector holds data (a flipped bit, not a cut write), a zero length or one past
/// `len_max` with data after it, or a record that checks once one bit of its length or of
/// its checksum is changed back.
pub fn is_torn_append(tail: &[u8], offset: u64, len_max: usize) -> bool {
    let Some(last) = tail.iter().rposition(|byte| *byte != 0) else {
        return true;
    };
    let Some(header) = tail.first_chunk::<HEADER_BYTES>() else {
        // The file ends inside the header.
        return true;
    };
    let (len, crc) = match parse_header(header, len_max) {
        Ok(parsed) => parsed,
        // A zero length, or one no record has, with data after it.
        Err(_) => return false,
    };
    if checks_one_bit_off(tail, len, crc, len_max) {
        return false;
    }
    let record_end = HEADER_BYTES + len;
    if tail.len() < record_end {
        // The file ends inside the record: the write was cut there.
        return true;
    }
    // Where the write stopped: the first sector boundary after its last byte of data.
    let written_end = offset + last as u64 + 1;
    let cut = written_end.next_multiple_of(SECTOR_BYTES);
    cut < offset + record_end as u64
}

/// Whether the record at the start of `tail`, with header `(len, crc)`, checks once one bit
/// of its checksum, or of its length, is changed: a flipped bit, where a cut write would
/// have left zeros.
fn checks_one_bit_off(tail: &[u8], len: usize, crc: u32, len_max: usize) -> bool {
    let body_crc = |len: usize| {
        tail.get(HEADER_BYTES..HEADER_BYTES + len)
            .map(crc32fast::hash)
    };
    if body_crc(len).is_some_and(|computed| (computed ^ crc).count_ones() == 1) {
        return true;
    }
    (0..u32::BITS)
        .filter_map(|bit| usize::try_from(u32::try_from(len).ok()? ^ (1 << bit)).ok())
        .filter(|other| (1..=len_max).contains(other))
        .any(|other| body_crc(other) == Some(crc))
}

/// Records read one after another from a stream (a journal replayed through a buffer).
pub struct Records<R> {
    reader: R,
    len_max: usize,
    /// Where the next record starts: the end of the last whole, intact one.
    offset: u64,
    body: Vec<u8>,
}

impl<R: Read> Records<R> {
    /// Reads records of at most `len_max` bytes of body from `reader`.
    pub fn new(reader: R, len_max: usize) -> Self {
        Self {
            reader,
            len_max,
            offset: 0,
            body: Vec::new(),
        }
    }

    /// Where the next record starts (the end of the last one read).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next record's body, or why there is none.
    ///
    /// # Errors
    /// When the stream cannot be read: that is not damage, and nothing can be concluded.
    pub fn next_body(&mut self) -> io::Result<Result<&[u8], Stop>> {
        let mut header = [0u8; HEADER_BYTES];
        let mut filled = 0;
        while filled < HEADER_BYTES {
            match self.reader.read(&mut header[filled..]) {
                Ok(0) if filled == 0 => return Ok(Err(Stop::End)),
                Ok(0) => return Ok(Err(Stop::Torn("a record header was cut short".to_owned()))),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let (len, crc) = match parse_header(&header, self.len_max) {
            Ok(parsed) => parsed,
            Err(stop) => return Ok(Err(stop)),
        };
        self.body.resize(len, 0);
        match self.reader.read_exact(&mut self.body) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Ok(Err(Stop::Torn("a record body was cut short".to_owned())))
            }
            Err(e) => return Err(e),
        }
        if let Err(stop) = check(&self.body, crc) {
            return Ok(Err(stop));
        }
        self.offset += (HEADER_BYTES + len) as u64;
        Ok(Ok(&self.body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN_MAX: usize = 1 << 20;

    fn framed(bodies: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for body in bodies {
            push(&mut out, &[body]).expect("push");
        }
        out
    }

    /// Every record read back by both readers, in order, then how the input ended.
    fn read_both(bytes: &[u8]) -> (Vec<Vec<u8>>, Stop) {
        let mut by_slice = Vec::new();
        let mut at = 0;
        let slice_stop = loop {
            match read_at(bytes, at, LEN_MAX) {
                Ok((body, next)) => {
                    by_slice.push(body.to_vec());
                    at = next;
                }
                Err(stop) => break stop,
            }
        };
        let mut records = Records::new(bytes, LEN_MAX);
        let mut by_stream = Vec::new();
        let stream_stop = loop {
            match records.next_body().expect("in memory") {
                Ok(body) => by_stream.push(body.to_vec()),
                Err(stop) => break stop,
            }
        };
        assert_eq!(by_slice, by_stream, "the two readers agree");
        assert_eq!(slice_stop, stream_stop, "the two readers agree");
        assert_eq!(records.offset() as usize, at, "and end at the same place");
        (by_slice, slice_stop)
    }

    #[test]
    fn records_read_back_in_order_and_parts_make_one_body() {
        let mut bytes = framed(&[b"one", b"two"]);
        push(&mut bytes, &[&[7], b"kind first"]).expect("push");
        let (bodies, stop) = read_both(&bytes);
        assert_eq!(
            bodies,
            vec![b"one".to_vec(), b"two".to_vec(), b"\x07kind first".to_vec()]
        );
        assert_eq!(stop, Stop::End);
    }

    #[test]
    fn zeros_after_the_records_are_a_clean_stop() {
        let mut bytes = framed(&[b"one"]);
        bytes.extend_from_slice(&[0; 64]);
        assert_eq!(read_both(&bytes), (vec![b"one".to_vec()], Stop::Zeros));
    }

    /// A cut anywhere in the last record, a flipped bit and a length past the limit each
    /// stop before the damaged record, keeping every record before it.
    #[test]
    fn a_torn_or_corrupt_record_stops_the_read_and_keeps_the_ones_before() {
        let whole = framed(&[b"first", b"second record"]);
        let first_end = HEADER_BYTES + b"first".len();
        for cut in first_end + 1..whole.len() {
            let (bodies, stop) = read_both(&whole[..cut]);
            assert_eq!(bodies, vec![b"first".to_vec()], "cut at {cut}");
            assert!(matches!(stop, Stop::Torn(_)), "cut at {cut}: {stop:?}");
        }
        let mut flipped = whole.clone();
        *flipped.last_mut().expect("a byte") ^= 0x01;
        let (bodies, stop) = read_both(&flipped);
        assert_eq!(bodies, vec![b"first".to_vec()]);
        assert_eq!(stop, Stop::Torn("a record failed its checksum".to_owned()));
        let mut huge = framed(&[b"first"]);
        huge.extend_from_slice(&(LEN_MAX as u32 + 1).to_le_bytes());
        huge.extend_from_slice(&[0; 4]);
        let (bodies, stop) = read_both(&huge);
        assert_eq!(bodies, vec![b"first".to_vec()]);
        assert!(matches!(stop, Stop::Torn(reason) if reason.contains("claims")));
    }

    /// A record long enough to cross sector boundaries, at byte `offset` of its file.
    fn long_record() -> Vec<u8> {
        let body: Vec<u8> = (0..1500u32).map(|i| (i % 200 + 1) as u8).collect();
        framed(&[&body])
    }

    /// What a crash leaves: a record cut at a sector boundary with zeros after it, or cut
    /// short by the end of the file, anywhere in it (its header too); or only zeros.
    #[test]
    fn a_write_cut_at_a_sector_boundary_or_by_the_end_of_the_file_is_torn() {
        let record = long_record();
        for offset in [0u64, 100, 511] {
            let cut = offset.next_multiple_of(SECTOR_BYTES).max(SECTOR_BYTES) - offset;
            let mut torn = record.clone();
            torn[cut as usize..].fill(0);
            torn.extend_from_slice(&[0; 4096]);
            assert!(is_torn_append(&torn, offset, LEN_MAX), "zeros from {cut}");
        }
        for len in 1..record.len() {
            assert!(is_torn_append(&record[..len], 0, LEN_MAX), "cut at {len}");
        }
        assert!(is_torn_append(&[0; 600], 1000, LEN_MAX), "zeros only");
    }

    /// What no crash leaves: a flipped bit anywhere in a whole record (body, length,
    /// checksum), data after the damage, a zero or impossible length with data after it.
    #[test]
    fn a_flipped_bit_or_data_after_the_damage_is_not_torn() {
        let record = long_record();
        let mut padded = record.clone();
        padded.extend_from_slice(&[0; 4096]);
        for at in [3, 5, 100, 700, record.len() - 1] {
            let mut flipped = padded.clone();
            flipped[at] ^= 0x04;
            assert!(!is_torn_append(&flipped, 0, LEN_MAX), "flipped byte {at}");
        }
        // A length made longer by a flipped bit reaches into the zeros: still a flip.
        let mut longer = padded.clone();
        longer[1] ^= 0x08;
        assert!(!is_torn_append(&longer, 0, LEN_MAX));
        // A torn record followed by data: a later sector was written, an earlier one not.
        let mut gap = padded.clone();
        gap[512..1024].fill(0);
        assert!(!is_torn_append(&gap, 0, LEN_MAX));
        let mut after = record.clone();
        after[1200..].fill(0);
        after.extend_from_slice(&framed(&[b"later"]));
        assert!(!is_torn_append(&after, 0, LEN_MAX));
        let mut zero_len = vec![0; 8];
        zero_len.extend_from_slice(&record);
        assert!(!is_torn_append(&zero_len, 0, LEN_MAX));
        let mut huge = (LEN_MAX as u32 + 1).to_le_bytes().to_vec();
        huge.extend_from_slice(&[1; 64]);
        assert!(!is_torn_append(&huge, 0, LEN_MAX));
    }
}
