//! Key layout of the one sled tree. Every key starts with a family byte, then
//! big-endian fields, so byte order is the order we scan in.

use super::RunId;

pub const EVENT: u8 = b'E';
pub const LOG: u8 = b'L';
pub const RUN: u8 = b'R';
pub const APPROVAL: u8 = b'A';
pub const ACTIVE: u8 = b'W';
pub const TIMER: u8 = b'T';
pub const TOOL: u8 = b'K';
pub const REQUEST: u8 = b'I';
pub const GROUP: u8 = b'G';
pub const DEAD_LETTER: u8 = b'D';
pub const META: u8 = b'M';
pub const GRANT: u8 = b'N';
pub const GRANT_USE: u8 = b'U';
pub const FINISHED: u8 = b'X';
pub const EXPIRES: u8 = b'Y';
pub const TOMBSTONE: u8 = b'Z';
pub const TOMBSTONE_UNTIL: u8 = b'z';
pub const RUN_REQUEST: u8 = b'J';
pub const SEGMENT: u8 = b'S';
pub const RETIRED: u8 = b'Q';

/// `<family> ‖ time_ms ‖ run`: a finished run by its finish time (`X`,
/// runs that follow the server's retention), by the time its own
/// retention runs out (`Y`), or a tombstone by the time it goes (`z`).
pub fn timed(family: u8, time_ms: i64, run: RunId) -> Vec<u8> {
    let mut k = Vec::with_capacity(25);
    k.push(family);
    k.extend_from_slice(&(time_ms.max(0) as u64).to_be_bytes());
    k.extend_from_slice(run.as_bytes());
    k
}

/// Splits a [`timed`] key into (time_ms, run).
pub fn parse_timed(key: &[u8]) -> Option<(i64, RunId)> {
    if key.len() != 25 {
        return None;
    }
    let time = u64::from_be_bytes(key[1..9].try_into().ok()?) as i64;
    Some((time, RunId::from_slice(&key[9..25])?))
}

/// `J ‖ run ‖ request key`: an idempotency record that belongs to the
/// run, deleted with it.
pub fn run_request(run: RunId, request_key: &[u8]) -> Vec<u8> {
    let mut k = run_scoped(RUN_REQUEST, run);
    k.extend_from_slice(request_key);
    k
}

/// `Q ‖ start`: the log segment that starts at `start` was compacted
/// away; its file is deleted (again, at open, if a crash came first).
pub fn retired(start: u64) -> Vec<u8> {
    let mut k = vec![RETIRED];
    k.extend_from_slice(&start.to_be_bytes());
    k
}

/// `S ‖ start`: the event bytes of deleted runs in the log segment that
/// starts at `start` (see `super::compact`).
pub fn segment(start: u64) -> Vec<u8> {
    let mut k = vec![SEGMENT];
    k.extend_from_slice(&start.to_be_bytes());
    k
}

/// `E ‖ run ‖ seq`: a list of the run's spans in the log, the last one
/// ending at `seq` (see [`super::spans`]).
pub fn event(run: RunId, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(25);
    k.push(EVENT);
    k.extend_from_slice(run.as_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// `L ‖ position`: the log offset of the record whose last event has this
/// position.
pub fn log(position: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(LOG);
    k.extend_from_slice(&position.to_be_bytes());
    k
}

/// `<family> ‖ run`: run summaries, active runs, and the prefix of a run's events or approvals.
pub fn run_scoped(family: u8, run: RunId) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(family);
    k.extend_from_slice(run.as_bytes());
    k
}

/// `A ‖ run ‖ call_id`: a pending approval.
pub fn approval(run: RunId, call_id: &str) -> Vec<u8> {
    let mut k = run_scoped(APPROVAL, run);
    k.extend_from_slice(call_id.as_bytes());
    k
}

/// `T ‖ due_ms ‖ run ‖ name`: a durable timer.
pub fn timer(due_ms: i64, run: RunId, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(25 + name.len());
    k.push(TIMER);
    k.extend_from_slice(&(due_ms.max(0) as u64).to_be_bytes());
    k.extend_from_slice(run.as_bytes());
    k.extend_from_slice(name.as_bytes());
    k
}

/// Splits a timer key into (due_ms, run, name).
pub fn parse_timer(key: &[u8]) -> Option<(i64, RunId, String)> {
    if key.len() < 25 || key[0] != TIMER {
        return None;
    }
    let due = u64::from_be_bytes(key[1..9].try_into().ok()?) as i64;
    let run = RunId::from_slice(&key[9..25])?;
    let name = String::from_utf8(key[25..].to_vec()).ok()?;
    Some((due, run, name))
}

/// `K ‖ name`: a registered tool.
pub fn tool(name: &str) -> Vec<u8> {
    let mut k = vec![TOOL];
    k.extend_from_slice(name.as_bytes());
    k
}

/// `I ‖ scope ‖ request_id`: an idempotency record.
pub fn request(scope: &[u8], request_id: &str) -> Vec<u8> {
    let mut k = vec![REQUEST];
    k.extend_from_slice(&(scope.len() as u16).to_be_bytes());
    k.extend_from_slice(scope);
    k.extend_from_slice(request_id.as_bytes());
    k
}

/// Splits a request key into (scope, request_id).
pub fn parse_request(key: &[u8]) -> Option<(Vec<u8>, String)> {
    let len = u16::from_be_bytes(key.get(1..3)?.try_into().ok()?) as usize;
    let scope = key.get(3..3 + len)?.to_vec();
    let request_id = String::from_utf8(key.get(3 + len..)?.to_vec()).ok()?;
    Some((scope, request_id))
}

/// `M ‖ name`: one of the server's own settings.
pub fn meta(name: &str) -> Vec<u8> {
    let mut k = vec![META];
    k.extend_from_slice(name.as_bytes());
    k
}

/// `G ‖ group`: a consumer group's definition and durable cursor.
pub fn group(name: &str) -> Vec<u8> {
    let mut k = vec![GROUP];
    k.extend_from_slice(name.as_bytes());
    k
}

/// `D ‖ len(group) ‖ group ‖ position`: a dead letter of a group, in log order.
pub fn dead_letter(group: &str, position: u64) -> Vec<u8> {
    let mut k = dead_letters(group);
    k.extend_from_slice(&position.to_be_bytes());
    k
}

/// The prefix of a group's dead letters.
pub fn dead_letters(group: &str) -> Vec<u8> {
    let mut k = vec![DEAD_LETTER];
    k.extend_from_slice(&(group.len() as u16).to_be_bytes());
    k.extend_from_slice(group.as_bytes());
    k
}

/// `N ‖ id`: a standing grant.
pub fn grant(id: &str) -> Vec<u8> {
    let mut k = vec![GRANT];
    k.extend_from_slice(id.as_bytes());
    k
}

/// `U ‖ len(grant) ‖ grant ‖ run ‖ call_id`: one use of a grant. A use is
/// a key, not a counter, so two commits can never lose one.
pub fn grant_use(grant: &str, run: RunId, call_id: &str) -> Vec<u8> {
    let mut k = grant_uses(grant);
    k.extend_from_slice(run.as_bytes());
    k.extend_from_slice(call_id.as_bytes());
    k
}

/// The prefix of a grant's uses.
pub fn grant_uses(grant: &str) -> Vec<u8> {
    let mut k = vec![GRANT_USE];
    k.extend_from_slice(&(grant.len() as u16).to_be_bytes());
    k.extend_from_slice(grant.as_bytes());
    k
}

/// Splits a grant-use key into (grant, run, call_id).
pub fn parse_grant_use(key: &[u8]) -> Option<(String, RunId, String)> {
    let len = u16::from_be_bytes(key.get(1..3)?.try_into().ok()?) as usize;
    let grant = String::from_utf8(key.get(3..3 + len)?.to_vec()).ok()?;
    let run = RunId::from_slice(key.get(3 + len..19 + len)?)?;
    let call_id = String::from_utf8(key.get(19 + len..)?.to_vec()).ok()?;
    Some((grant, run, call_id))
}

/// The smallest key greater than every key starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![u8::MAX; prefix.len() + 1]
}
