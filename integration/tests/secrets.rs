//! Secrets never travel in a store URL (issue 43, item 10): `jfs-sync` and `jfs format`
//! refuse a secret option given inline (`password=`, `secret_access_key=`, `account_key=`,
//! a password in the user part) before anything runs, naming the option and the
//! environment reference to use instead, and never echo the value; with the reference
//! (`KEY=env:NAME`) the secret's value shows in no output either.

use integration::{fails_clearly, run};

const SECRET: &str = "hunter2-Sekr1t";

fn has_no_secret(o: &std::process::Output) {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!all.contains(SECRET), "the secret leaked: {all}");
}

#[test]
fn inline_secrets_in_store_urls_are_refused_and_never_echoed() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    let src = src.to_str().unwrap();
    let dav = |q: &str| format!("opendal+webdav://?endpoint=http://127.0.0.1:9/{q}");
    let cases = [
        (dav(&format!("&password={SECRET}")), "\"password\""),
        (
            format!("opendal+azblob://c?account_name=n&account_key={SECRET}"),
            "\"account_key\"",
        ),
        (
            format!("opendal+s3://b?access_key_id=AK&secret_access_key={SECRET}"),
            "\"secret_access_key\"",
        ),
        (format!("s3://AK:{SECRET}@bucket/p"), "user:password@"),
    ];
    for (url, names) in &cases {
        // As destination, as source, in `check` and in `job create` (whose record and hint
        // would carry it to every worker).
        let job = "--job=redis://127.0.0.1:1/0#j";
        for args in [
            vec![src, url.as_str()],
            vec![url.as_str(), src],
            vec!["check", src, url.as_str()],
            vec!["job", "create", src, url.as_str(), job],
        ] {
            let o = run("jfs-sync", &args, &[]);
            let line = fails_clearly(&o, names);
            assert!(
                line.contains("env:NAME") || line.contains("environment"),
                "{args:?}: {line}"
            );
            assert!(line.contains("***") || url.contains('@'), "{line}");
            has_no_secret(&o);
        }
        // A volume's store is refused the same way at format, and nothing is created.
        let meta = d.path().join("meta");
        let o = run(
            "jfs",
            &[
                "format",
                &format!("rocksdb://{}", meta.display()),
                "v",
                "--storage",
                url,
            ],
            &[],
        );
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        has_no_secret(&o);
        assert!(!meta.exists(), "a refused format left {}", meta.display());
    }
    // The documented way: the option names an environment variable. The run goes on (and
    // fails here, nothing answers at that address), and the value is in no line it writes.
    let url = dav("&username=u&password=env:JFS_TEST_DAV_PASS");
    let o = run(
        "jfs-sync",
        &[src, &url, "--retries", "0", "-v"],
        &[("JFS_TEST_DAV_PASS", SECRET)],
    );
    assert_ne!(o.status.code(), Some(0), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("holds a secret"), "{err}");
    has_no_secret(&o);
}
