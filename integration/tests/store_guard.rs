//! A volume's block store in an object store is refused as a plain `jfs-sync` destination
//! (and as a source with `--delete-src`), as local ones are (issue 43, item 20): the prefix
//! that holds volumes, one volume's prefix, and a prefix inside it. Needs the S3 server of
//! `integration/services.sh` (JFS_TEST_S3 and the AWS variables).

use integration::{fails_clearly, run, store_url};

#[test]
fn an_object_store_volume_prefix_is_refused_as_a_plain_destination() {
    let t = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/meta", t.path().display());
    let (store, _) = store_url("s3");
    let o = run("jfs", &["format", &meta, "vol1", "--storage", &store], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("chunks"), b"not a block").unwrap();
    let o = run("jfs", &["put", &meta, src.to_str().unwrap(), "/d"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let with_path = |p: &str| match store.split_once('?') {
        Some((b, q)) => format!("{b}{p}?{q}"),
        None => format!("{store}{p}"),
    };
    let s = src.to_str().unwrap();
    let cases: Vec<Vec<String>> = vec![
        vec!["--delete-dst".into(), s.into(), store.clone()],
        vec![s.into(), with_path("/vol1")],
        vec!["--delete-dst".into(), s.into(), with_path("/vol1/chunks")],
        vec![
            "--delete-src".into(),
            with_path("/vol1"),
            t.path().join("out").to_str().unwrap().into(),
        ],
    ];
    for args in &cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = fails_clearly(&run("jfs-sync", &a, &[]), "block store");
        assert!(
            err.contains("nothing was copied or deleted"),
            "{args:?}: {err}"
        );
    }
    assert!(!t.path().join("out").exists());
    let o = run("jfs", &["fsck", &meta, "--deep"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run("jfs", &["cat", &meta, "/d/chunks"], &[]);
    assert_eq!(o.stdout, b"not a block");
}
