//! Certificates for TLS tests: two CAs and a server certificate signed by one (openssl).

fn openssl(args: &[&str], dir: &std::path::Path) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA `<name>.crt`/`<name>.key`.
fn make_ca(dir: &std::path::Path, name: &str) {
    let (key, crt, subj) = (
        format!("{name}.key"),
        format!("{name}.crt"),
        format!("/CN={name}"),
    );
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend(["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subj]);
    openssl(&args, dir);
}

/// A CA (`ca.crt`), another CA (`other.crt`), and a server certificate for
/// `primary.test` signed by the first (`server.crt`, `server.key`), in `dir`.
pub fn make_certs(dir: &std::path::Path) {
    make_ca(dir, "ca");
    make_ca(dir, "other");
    openssl(
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=primary.test",
        ],
        dir,
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:primary.test\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
        dir,
    );
}
