use super::*;

/// Side requests are not workload; requests that cannot be rebuilt and malformed rows are
/// workload left out; the user's own --skip-recorded-failures is neither.
#[test]
fn the_left_out_share_counts_workload_only() {
    use crate::trace::select::{Skip, Skipped};
    let left_out = Skipped(
        [
            (Skip::Auxiliary, 50),
            (Skip::RecordedFailure, 5),
            (Skip::ChatWithoutTokenizer, 8),
            (Skip::EmptyPrompt, 1),
        ]
        .into_iter()
        .collect(),
    );
    assert_eq!(lost_workload(&left_out, 150, 1), (10, 101));
    assert_eq!(left_out_reason((10, 101)), None);
    let why = left_out_reason((11, 101)).unwrap_or_default();
    assert!(
        why.starts_with("11 of 101 workload requests left out (10.9%"),
        "{why}"
    );
    assert_eq!(left_out_reason((10, 100)), None);
    assert!(left_out_reason((11, 100)).is_some());
    assert_eq!(left_out_reason((0, 0)), None);
}

/// `--detailed` keeps its arrays inline up to the threshold; above it the sidecar beside
/// `--result-json` is opened before the run (removed when the run is abandoned; an
/// unwritable one fails at once); without a result file they stay inline.
#[test]
fn detailed_rows_go_to_the_sidecar_above_the_threshold() {
    use collect::Detail;
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("run.json");
    let r = Some(r.as_path());
    let over = crate::result::sidecar::THRESHOLD + 1;
    assert!(matches!(
        detail(r, true, crate::result::sidecar::THRESHOLD),
        Ok(Detail::Inline(_))
    ));
    let d = detail(r, true, over).unwrap();
    assert!(matches!(d, Detail::File(_)));
    let partial = dir.path().join("run.requests.jsonl.partial");
    assert!(partial.exists());
    drop(d);
    assert!(!partial.exists(), "an abandoned run leaves no partial file");
    assert!(matches!(detail(None, true, over), Ok(Detail::Inline(_))));
    assert!(matches!(detail(r, false, over), Ok(Detail::Off)));
    let bad = std::path::Path::new("/nonexistent/dir/run.json");
    let e = detail(Some(bad), true, over).err().unwrap().to_string();
    assert!(
        e.contains("run.requests.jsonl") && e.contains("cannot write"),
        "{e}"
    );
}
