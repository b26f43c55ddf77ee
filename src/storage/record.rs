//! The one record framing of the node's append-only files (the Raft log's WAL segments and
//! the claim journals): `[body length: u32 LE][CRC-32 of body: u32 LE][body]`.
//!
//! Reading stops at the first record that is not whole and intact, and says why
//! ([`Stop`]): the input ended on a record boundary, a zero length begins (a WAL segment is
//! made of zeros, so its records end there), or the record is torn or corrupt (cut short,
//! a length past the limit, a checksum that fails). A crash can only tear the last append,
//! which was never acknowledged (acknowledgements wait for the fsync); so each owner
//! decides what a stop means where it happened: the WAL cuts a torn tail of its last
//! segment and refuses one anywhere else, the journal drops its tail and compacts.

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
}
