//! Where a reader of the whole log stands: for each shard, the position of
//! the last event it has read there.
//!
//! Positions are unique across the log and increase in commit order within
//! each shard, but not across shards: servers commit disjoint shards at the
//! same time, each taking positions as it goes, so a commit of shard 3 can
//! land after one of shard 7 with a higher position. A single number can
//! therefore not say what a reader has seen; one number per shard can, and
//! a read "after" a cursor never skips or repeats an event of any shard.
//!
//! Clients see a cursor as an opaque resume token ([`Cursor::encode`]). A
//! position from before the log was partitioned (one head, positions in
//! commit order across the whole log) is the cursor [`Cursor::at`] it, so
//! old tokens keep their meaning.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::{RunId, SHARDS};

/// Per shard, the position of the last event read (0: none).
#[derive(Clone, PartialEq, Eq)]
pub struct Cursor(Box<[u64; SHARDS]>);

/// Why a resume token was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct BadToken(pub &'static str);

/// The first byte of an encoded cursor: its form.
const UNIFORM: u8 = 0;
const PER_SHARD: u8 = 1;

impl Cursor {
    /// Before the first event of every shard.
    pub fn start() -> Cursor {
        Cursor::at(0)
    }

    /// After `position` in every shard: what a reader of a log with one
    /// commit order has seen once it read that far.
    pub fn at(position: u64) -> Cursor {
        Cursor(Box::new([position; SHARDS]))
    }

    /// Moves every shard to `position` (see [`Cursor::at`]), in place.
    pub fn set_all(&mut self, position: u64) {
        self.0.fill(position);
    }

    /// The position last read in `shard`.
    pub fn after(&self, shard: u8) -> u64 {
        self.0[usize::from(shard)]
    }

    /// Whether an event of `run` at `position` is past this cursor (not
    /// read yet).
    pub fn passes(&self, run: RunId, position: u64) -> bool {
        position > self.after(run.shard())
    }

    /// Records that the event of `run` at `position` was read.
    pub fn read(&mut self, run: RunId, position: u64) {
        self.advance(run.shard(), position);
    }

    /// Moves `shard` to `position` if that is further.
    pub fn advance(&mut self, shard: u8, position: u64) {
        let slot = &mut self.0[usize::from(shard)];
        *slot = (*slot).max(position);
    }

    /// Moves `shard` back to `position` if that is earlier (a reader that
    /// must see an event again).
    pub fn lower(&mut self, shard: u8, position: u64) {
        let slot = &mut self.0[usize::from(shard)];
        *slot = (*slot).min(position);
    }

    /// Moves every shard that `other` has further.
    pub fn merge(&mut self, other: &Cursor) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0.iter()) {
            *mine = (*mine).max(*theirs);
        }
    }

    /// Whether every shard of `self` is at or past `other`'s.
    pub fn covers(&self, other: &Cursor) -> bool {
        self.0.iter().zip(other.0.iter()).all(|(a, b)| a >= b)
    }

    /// The lowest position of any shard: every event at or below it has
    /// been read, whatever its shard.
    pub fn least(&self) -> u64 {
        self.0.iter().copied().min().unwrap_or(0)
    }

    /// The highest position of any shard.
    pub fn most(&self) -> u64 {
        self.0.iter().copied().max().unwrap_or(0)
    }

    /// Shards and positions, in shard order.
    pub fn shards(&self) -> impl Iterator<Item = (u8, u64)> + '_ {
        self.0.iter().enumerate().map(|(s, p)| (s as u8, *p))
    }

    /// How far `self` is behind `ahead`, summed over the shards (positions,
    /// not events: positions have gaps).
    pub fn behind(&self, ahead: &Cursor) -> u64 {
        self.0
            .iter()
            .zip(ahead.0.iter())
            .map(|(a, b)| b.saturating_sub(*a))
            .sum()
    }

    /// The stored form: `[0] varint(p)` when every shard is at `p`, else
    /// `[1] varint(top)` and each shard's distance below `top` as a varint
    /// (small where shards are busy, as they are near the top).
    pub fn to_bytes(&self) -> Vec<u8> {
        let top = self.most();
        let mut out = Vec::with_capacity(8);
        if self.0.iter().all(|p| *p == top) {
            out.push(UNIFORM);
            put_varint(&mut out, top);
            return out;
        }
        out.reserve(SHARDS * 2);
        out.push(PER_SHARD);
        put_varint(&mut out, top);
        for p in self.0.iter() {
            put_varint(&mut out, top - p);
        }
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Cursor, BadToken> {
        let (&form, mut rest) = bytes.split_first().ok_or(BadToken("it is empty"))?;
        let top = take_varint(&mut rest)?;
        let cursor = match form {
            UNIFORM => Cursor::at(top),
            PER_SHARD => {
                let mut shards = [0u64; SHARDS];
                for slot in shards.iter_mut() {
                    let below = take_varint(&mut rest)?;
                    *slot = top
                        .checked_sub(below)
                        .ok_or(BadToken("a shard is below 0"))?;
                }
                Cursor(Box::new(shards))
            }
            _ => return Err(BadToken("its form is unknown (from a newer server?)")),
        };
        match rest.is_empty() {
            true => Ok(cursor),
            false => Err(BadToken("it has bytes after its end")),
        }
    }

    /// The resume token clients are given: opaque, URL-safe text.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.to_bytes())
    }

    pub fn decode(token: &str) -> Result<Cursor, BadToken> {
        // A per-shard cursor is at most 1 + 10 * 257 bytes.
        if token.len() > 4 * SHARDS * 10 {
            return Err(BadToken("it is longer than any token this server gives"));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| BadToken("it is not base64url text"))?;
        Cursor::from_bytes(&bytes)
    }
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor::start()
    }
}

impl std::fmt::Debug for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (least, most) = (self.least(), self.most());
        match least == most {
            true => write!(f, "Cursor(at {least})"),
            false => write!(f, "Cursor({least}..={most})"),
        }
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(bytes: &mut &[u8]) -> Result<u64, BadToken> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or(BadToken("it ends early"))?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f)
            .checked_shl(shift)
            .filter(|v| v >> shift == u64::from(byte & 0x7f))
            .ok_or(BadToken("a number is too large"))?;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(BadToken("a number is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_in(shard: u8) -> RunId {
        let mut bytes = [7u8; 16];
        bytes[15] = shard;
        RunId::from_slice(&bytes).unwrap()
    }

    #[test]
    fn a_read_moves_only_its_shard() {
        let mut cursor = Cursor::at(10);
        cursor.read(run_in(3), 42);
        assert!(!cursor.passes(run_in(3), 42));
        assert!(cursor.passes(run_in(3), 43));
        assert!(cursor.passes(run_in(4), 11));
        assert_eq!((cursor.least(), cursor.most()), (10, 42));
        cursor.read(run_in(3), 20);
        assert_eq!(cursor.after(3), 42, "a cursor never moves back on a read");
    }

    #[test]
    fn tokens_round_trip_and_stay_small_when_uniform() {
        let uniform = Cursor::at(123_456);
        assert!(uniform.encode().len() < 8, "{}", uniform.encode());
        assert_eq!(Cursor::decode(&uniform.encode()), Ok(uniform));
        let mut spread = Cursor::at(1_000_000);
        for shard in 0..=255u8 {
            spread.advance(shard, 1_000_000 + u64::from(shard) * 37);
        }
        spread.lower(9, 5);
        assert_eq!(Cursor::decode(&spread.encode()), Ok(spread.clone()));
        assert_eq!(Cursor::from_bytes(&spread.to_bytes()), Ok(spread));
    }

    #[test]
    fn bad_tokens_say_what_is_wrong() {
        assert_eq!(Cursor::decode(""), Err(BadToken("it is empty")));
        assert_eq!(
            Cursor::decode("!!"),
            Err(BadToken("it is not base64url text"))
        );
        let mut bytes = Cursor::at(5).to_bytes();
        bytes.push(0);
        assert_eq!(
            Cursor::from_bytes(&bytes),
            Err(BadToken("it has bytes after its end"))
        );
        assert_eq!(
            Cursor::from_bytes(&[9, 1]),
            Err(BadToken("its form is unknown (from a newer server?)"))
        );
        assert_eq!(
            Cursor::from_bytes(&[1, 1, 2]),
            Err(BadToken("a shard is below 0"))
        );
        assert!(Cursor::from_bytes(&[
            0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f
        ])
        .is_err());
    }
}
