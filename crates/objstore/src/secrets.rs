//! Secrets in store URLs. A store URL travels far: process arguments (`ps`), log and error
//! lines, a shared job's record, `job status`, the hint that says how to start more workers.
//! So a URL never holds a secret: an option that names one (`password`, `secret_access_key`,
//! `account_key`, a token...) must be an environment reference (`KEY=env:NAME`, read when
//! the store opens), and a password in the URL's user part is refused the same way.
//! `redact` is the belt to those braces: every URL shown anywhere goes through it.

/// Whether an option of a store URL holds a secret by its name. Identifiers that are not
/// secret by themselves (`access_key_id`, `account_name`, `key_id`) are not.
pub fn is_secret_option(key: &str) -> bool {
    let k = key.to_ascii_lowercase().replace('-', "_");
    if k.ends_with("_id") || k.ends_with("_name") || k.ends_with("_file") || k == "key_path" {
        return false;
    }
    [
        "password",
        "secret",
        "token",
        "credential",
        "sas",
        "private",
        "passphrase",
    ]
    .iter()
    .any(|w| k.contains(w))
        || k == "key"
        || k.ends_with("_key")
}

/// A URL of a store (not a local path, which may hold `?` and `@` in its names).
fn is_url(s: &str) -> bool {
    s.split_once("://")
        .is_some_and(|(scheme, _)| scheme != "file" && !scheme.contains('/'))
}

/// The URL's query as (key, raw value) pairs, in order.
fn query(url: &str) -> Vec<(String, String)> {
    match url.split_once('?') {
        Some((_, q)) => url::form_urlencoded::parse(q.as_bytes())
            .into_owned()
            .collect(),
        None => Vec::new(),
    }
}

/// The password part of `scheme://user:password@host...`, if any.
fn userinfo_password(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let auth_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let at = url[start..auth_end].rfind('@')? + start;
    let colon = url[start..at].find(':')? + start;
    Some((colon + 1, at))
}

/// Refuse a URL that holds a secret inline: the message names the option (never its value)
/// and says how to pass it instead.
pub fn check(url: &str) -> std::result::Result<(), String> {
    if !is_url(url) {
        return Ok(());
    }
    if userinfo_password(url).is_some() {
        return Err("a password in the URL (user:password@): give credentials through the environment (e.g. AWS_SECRET_ACCESS_KEY, or an option KEY=env:NAME), never in the URL, which shows in `ps`, logs and job records".into());
    }
    for (k, v) in query(url) {
        if userinfo_password(&v).is_some() {
            return Err(format!(
                "option {k:?} holds a URL with a password in it (user:password@): give credentials through the environment (an option KEY=env:NAME), never in the URL, which shows in `ps`, logs and job records"
            ));
        }
        if is_secret_option(&k) && !v.starts_with("env:") {
            return Err(format!(
                "option {k:?} holds a secret and is given inline: pass it as {k}=env:NAME and export NAME=<the secret> (a value in the URL shows in `ps`, logs, job records and `job status`)"
            ));
        }
    }
    Ok(())
}

/// The URL with every secret replaced by `***`: the value of each secret option that is not
/// an environment reference, and a password in the user part. Anything that cannot be parsed
/// as a query keeps its shape; only values are replaced.
pub fn redact(url: &str) -> String {
    if !is_url(url) {
        return url.to_string();
    }
    let mut out = url.to_string();
    if let Some((a, b)) = userinfo_password(&out) {
        out.replace_range(a..b, "***");
    }
    let Some((head, q)) = out.split_once('?') else {
        return out;
    };
    let (q, frag) = match q.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (q, None),
    };
    let parts: Vec<String> = q
        .split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key: String = url::form_urlencoded::parse(k.as_bytes())
                .next()
                .map(|(k, _)| k.into_owned())
                .unwrap_or_default();
            let value: String = url::form_urlencoded::parse(format!("x={v}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            if is_secret_option(&key) && !value.starts_with("env:") {
                format!("{k}=***")
            } else if userinfo_password(&value).is_some() {
                // A URL in an option (an endpoint) with a password in its user part.
                let hidden = redact(&value);
                format!(
                    "{k}={}",
                    url::form_urlencoded::byte_serialize(hidden.as_bytes()).collect::<String>()
                )
            } else {
                pair.to_string()
            }
        })
        .collect();
    let mut s = format!("{head}?{}", parts.join("&"));
    if let Some(f) = frag {
        s.push('#');
        s.push_str(f);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_options_are_known_by_name() {
        for k in [
            "password",
            "secret_access_key",
            "account_key",
            "sas_token",
            "session_token",
            "credential",
            "private_key",
            "key",
            "Secret-Access-Key",
        ] {
            assert!(is_secret_option(k), "{k}");
        }
        for k in [
            "root",
            "bucket",
            "endpoint",
            "access_key_id",
            "account_name",
            "username",
            "region",
            "credential_file",
        ] {
            assert!(!is_secret_option(k), "{k}");
        }
    }

    #[test]
    fn inline_secrets_are_refused_without_their_value() {
        let e = check("opendal+webdav://x?endpoint=http://h&password=hunter2").unwrap_err();
        assert!(
            e.contains("\"password\"") && e.contains("password=env:NAME"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
        let e = check("opendal+azblob://c?account_name=a&account_key=S3CR3T").unwrap_err();
        assert!(!e.contains("S3CR3T") && e.contains("account_key"), "{e}");
        let e = check("s3://AK:S3CR3T@bucket/p").unwrap_err();
        assert!(!e.contains("S3CR3T"), "{e}");
        check("opendal+webdav://x?endpoint=http://h&password=env:DAV_PASS").unwrap();
        check("opendal+webdav://x?username=u&endpoint=http://h:8080/a").unwrap();
        check("s3://bucket/prefix?endpoint=http://127.0.0.1:9000").unwrap();
        check("file:///data/store").unwrap();
        check("/data/dir?password=x").unwrap();
    }

    #[test]
    fn a_password_inside_an_options_url_is_refused_and_hidden() {
        let u = "opendal+webdav://?endpoint=http://u:hunter2@127.0.0.1:1";
        let e = check(u).unwrap_err();
        assert!(e.contains("endpoint") && !e.contains("hunter2"), "{e}");
        let r = redact(u);
        assert!(!r.contains("hunter2") && r.contains("endpoint="), "{r}");
        let s3 = "s3://b/p?endpoint=http%3A%2F%2Fu%3Ahunter2%40h%3A9000";
        assert!(check(s3).is_err());
        assert!(!redact(s3).contains("hunter2"), "{}", redact(s3));
        assert!(check("s3://b/p?endpoint=http://h:9000").is_ok());
    }

    #[test]
    fn redact_hides_every_secret_value_and_keeps_the_rest() {
        let check = |url: &str, want: &str| assert_eq!(redact(url), want, "{url}");
        check(
            "opendal+webdav://x?endpoint=http://h&password=hunter2&root=/a",
            "opendal+webdav://x?endpoint=http://h&password=***&root=/a",
        );
        check(
            "opendal+azblob://c?account_key=a%2Fb%3D&account_name=n",
            "opendal+azblob://c?account_key=***&account_name=n",
        );
        check(
            "opendal+webdav://x?password=env:DAV_PASS",
            "opendal+webdav://x?password=env:DAV_PASS",
        );
        check("s3://AK:SECRET@bucket/p", "s3://AK:***@bucket/p");
        check("file:///a/b", "file:///a/b");
        check("/local/dir?x", "/local/dir?x");
        check("/d/a?password=x", "/d/a?password=x");
        check("file:///d/u:p@x?token=1", "file:///d/u:p@x?token=1");
    }
}
