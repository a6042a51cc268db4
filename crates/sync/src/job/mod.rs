//! One sync job shared by many workers on many hosts, kept in Redis or PostgreSQL (an engine
//! the user already runs).
//!
//! The key space is cut into ranges (units). A worker claims a unit with a lease and a fencing
//! token, lists and copies that range itself (no host lists the whole tree), and saves a
//! resume cursor with the tally of what the keys up to it came to. The lease is renewed at a
//! third of its length; a worker that dies or is cut off loses it, and another worker claims
//! the unit (a new token) and resumes from the cursor. Every save, finish and release names
//! the token: one whose lease passed to another worker is refused, so a late worker cannot
//! record progress over the new holder's.
//!
//! Planning is the first split: the job starts as one unit covering everything, and the
//! worker that claims a fresh unit whose range starts at a directory lists that one level and
//! hands the subtrees back as new units (again, lazily, a level deeper when those are
//! claimed). Deletes (--delete-dst) are one more unit, claimable only once every range is
//! done without errors. The job's bandwidth and request limits are one token bucket in the
//! engine that every worker draws from, changeable while the job runs.

mod board;
mod deletes;
mod lease;
pub mod pg;
mod redis;
mod rounds;
mod sharing;
mod status;
mod worker;

pub use board::*;
use deletes::*;
use lease::*;
pub use rounds::*;
pub use sharing::*;
pub use status::*;
pub use worker::*;

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(identity: &str) -> Spec {
        Spec {
            src: "/a".into(),
            dst: "s3://b/p?endpoint=http://x".into(),
            src_id: Some("directory /a".into()),
            dst_id: None,
            identity: identity.into(),
            delete_dst: false,
            max_delete: None,
            from_journal: false,
            legacy_identity: None,
        }
    }

    /// A job's record and a worker's report as the release before this one wrote them.
    const SPEC_V1: &str = r#"{"src":"/a","dst":"s3://b/p","src_id":"directory /a","dst_id":null,"identity":"--checksum=false","delete_dst":true,"max_delete":"5%","from_journal":false}"#;
    const REPORT_V1: &str = r#"{"worker":"h-1","host":"h","pid":7,"totals":{"dry_run":false,"listed":2,"copied":2,"updated":0,"skipped":0,"skipped_reasons":{},"excluded":0,"failed":0,"deleted":0,"extra":0,"bytes":4,"checked":0,"resumed":null,"seconds":1.0},"rate":2.5,"units":[1,3],"refused":0,"age_ms":0}"#;

    #[test]
    fn records_of_the_release_before_decode_and_newer_ones_are_refused() {
        use fs_core::record::decode;
        let s: Spec = decode(SPEC_V1.as_bytes()).unwrap();
        assert_eq!((s.src.as_str(), s.dst.as_str()), ("/a", "s3://b/p"));
        assert_eq!(s.max_delete.as_deref(), Some("5%"));
        assert!(s.delete_dst && s.same_work(&decode(record_json(&s).as_bytes()).unwrap()));
        let r: WorkerReport = decode(REPORT_V1.as_bytes()).unwrap();
        assert_eq!((r.pid, r.units.clone(), r.totals.bytes), (7, vec![1, 3], 4));
        assert!(record_json(&r).contains(r#""version":1"#));
        for (raw, kind) in [(SPEC_V1, "job's record"), (REPORT_V1, "report")] {
            let newer = raw.replacen('{', r#"{"version":2,"#, 1);
            let e = if kind == "report" {
                decode::<WorkerReport>(newer.as_bytes())
                    .map(|_| ())
                    .unwrap_err()
            } else {
                decode::<Spec>(newer.as_bytes()).map(|_| ()).unwrap_err()
            };
            assert_eq!(e.kind(), fs_core::ErrorKind::UnsupportedVersion);
            assert!(e.to_string().contains(kind), "{e}");
        }
    }

    #[test]
    fn differences_name_the_option_and_both_values() {
        let job = spec(&options_identity(&[
            ("--checksum", "false".into()),
            ("--dirs", "true".into()),
        ]));
        let mut w = spec(&options_identity(&[
            ("--checksum", "true".into()),
            ("--dirs", "true".into()),
        ]));
        w.dst = "s3://b/p?endpoint=http://y".into(); // another endpoint: the same bucket
        assert_eq!(
            job.differences(&w),
            [r#"--checksum: the job has "false", this worker has "true""#]
        );
        w.identity = job.identity.clone();
        assert!(job.same_work(&w));
        w.src_id = Some("directory /elsewhere/a".into());
        assert_eq!(
            job.differences(&w),
            [
                r#"what SRC /a is: the job has "directory /a", this worker has "directory /elsewhere/a""#
            ]
        );
        // A job the release before made: one string of options, joined when it matches.
        let mut old = spec("[]|None|falsefalse");
        old.src_id = None;
        let mut w = spec(&job.identity);
        assert!(!old.same_work(&w));
        w.legacy_identity = Some("[]|None|falsefalse".into());
        assert!(old.same_work(&w));
    }
}
