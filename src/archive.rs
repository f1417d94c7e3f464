//! Run archives: a run's events as one gzip-compressed JSON Lines file,
//! `RUN_ID.jsonl.gz`, one event per line in seq order. Written by the
//! retention sweep before it deletes a run (`--archive-dir`) and by
//! `aaa runs export RUN`; the format is the same (docs/retention.md):
//!
//! ```text
//! {"run_id":"…","seq":1,"position":7,"id":"…","type":"aaa.run.started",
//!  "time_ms":1764750000000,"actor":{"kind":"client","name":"alice","principal":""},
//!  "data":{…the event's data, the JSON text as appended…}}
//! ```

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::store::{EventRecord, RunId};

/// One event as its archive line (without the newline). `data` is the
/// event's JSON text as appended, so numbers keep their exact digits.
pub fn line(event: &EventRecord) -> String {
    let run = RunId::from_slice(&event.run_id).map_or_else(String::new, |r| r.to_string());
    let id = uuid::Uuid::from_slice(&event.id).map_or_else(|_| String::new(), |u| u.to_string());
    let kind = match event.actor_kind {
        1 => "engine",
        2 => "worker",
        3 => "client",
        _ => "unspecified",
    };
    let head = serde_json::json!({
        "run_id": run,
        "seq": event.seq,
        "position": event.position,
        "id": id,
        "type": event.event_type,
        "time_ms": event.time_ms,
        "actor": {"kind": kind, "name": event.actor_name, "principal": event.actor_principal},
    })
    .to_string();
    let data = if serde_json::from_str::<serde::de::IgnoredAny>(&event.data_json).is_ok() {
        event.data_json.as_str()
    } else {
        "{}"
    };
    // `head` is an object: put `data` in before its closing brace.
    format!("{},\"data\":{data}}}", &head[..head.len() - 1])
}

/// The archive file of `run` in `dir`.
pub fn path(dir: &Path, run: RunId) -> PathBuf {
    dir.join(format!("{run}.jsonl.gz"))
}

/// Writes the events as `RUN_ID.jsonl.gz` in `dir` (made if missing),
/// durably: a temporary file, fsynced, renamed into place, and the
/// directory fsynced. An archive written before is replaced.
pub fn write(dir: &Path, run: RunId, events: &[EventRecord]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let target = path(dir, run);
    let temporary = dir.join(format!("{run}.jsonl.gz.tmp"));
    let written = (|| {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temporary)?;
        let file = write_to(file, events)?;
        file.sync_all()?;
        std::fs::rename(&temporary, &target)?;
        File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map(|()| target)
}

/// Writes the events, gzip-compressed, to `out`; returns it.
pub fn write_to<W: Write>(out: W, events: &[EventRecord]) -> std::io::Result<W> {
    let mut gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(out), Default::default());
    for event in events {
        gz.write_all(line(event).as_bytes())?;
        gz.write_all(b"\n")?;
    }
    gz.finish()?.into_inner().map_err(|e| e.into_error())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn an_archive_is_gzip_json_lines_with_exact_data() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new();
        let event = |seq: u64, data: &str| EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq,
            position: 10 + seq,
            id: uuid::Uuid::now_v7().as_bytes().to_vec(),
            event_type: "app.test".into(),
            data_json: data.into(),
            time_ms: 1_000,
            actor_kind: 3,
            actor_name: "alice".into(),
            actor_principal: String::new(),
        };
        let events = [
            event(1, r#"{"amount":12345678901234567890}"#),
            event(2, "{}"),
        ];
        let path = write(dir.path(), run, &events).unwrap();
        assert_eq!(path, dir.path().join(format!("{run}.jsonl.gz")));
        let mut text = String::new();
        flate2::read::GzDecoder::new(File::open(&path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].ends_with(r#""data":{"amount":12345678901234567890}}"#));
        let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(first["run_id"], run.to_string());
        assert_eq!(first["seq"], 1);
        assert_eq!(first["position"], 11);
        assert_eq!(first["actor"]["kind"], "client");
        assert_eq!(first["actor"]["name"], "alice");
        let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(leftovers, 1, "no temporary file is left");
    }
}
