//! What OpenDAL does not offer, through aws-sdk-s3 on the same endpoint and credentials:
//! multipart uploads that survive the process (the upload id is kept in the resume state;
//! a restarted run asks S3 which parts it has and uploads only the rest), and server-side
//! copy between buckets (CopyObject).

use anyhow::{anyhow, Context, Result};
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;

pub struct S3Native {
    pub client: aws_sdk_s3::Client,
    pub bucket: String,
    /// Key prefix inside the bucket, "" or ending in '/'.
    pub prefix: String,
    pub endpoint: Option<String>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Percent-encode a key for the x-amz-copy-source header (keep '/' and unreserved bytes).
fn encode_path(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl S3Native {
    pub fn new(
        bucket: &str,
        prefix: &str,
        endpoint: Option<String>,
        region: Option<String>,
    ) -> Option<Self> {
        let (ak, sk) = (env("AWS_ACCESS_KEY_ID")?, env("AWS_SECRET_ACCESS_KEY")?);
        let creds = Credentials::new(ak, sk, env("AWS_SESSION_TOKEN"), None, "environment");
        let region = region
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let mut b = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(creds)
            .force_path_style(true)
            // Checksums only where the API requires them: older S3 servers (Ceph Pacific)
            // reject the newer flexible-checksum headers.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if let Some(ep) = &endpoint {
            b = b.endpoint_url(ep);
        }
        Some(S3Native {
            client: aws_sdk_s3::Client::from_conf(b.build()),
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint,
        })
    }

    pub fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub async fn create(&self, key: &str) -> Result<String> {
        let r = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(self.full(key))
            .send()
            .await
            .map_err(|e| {
                anyhow!(
                    "starting the multipart upload of {key}: {}",
                    DisplayErrorContext(&e)
                )
            })?;
        r.upload_id()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("{key}: the store gave no upload id"))
    }

    /// Parts already uploaded: (part number, size, ETag). None when the upload is gone.
    pub async fn parts(
        &self,
        key: &str,
        upload_id: &str,
    ) -> Result<Option<Vec<(i32, i64, String)>>> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let mut req = self
                .client
                .list_parts()
                .bucket(&self.bucket)
                .key(self.full(key))
                .upload_id(upload_id);
            if let Some(m) = &marker {
                req = req.part_number_marker(m);
            }
            let r = match req.send().await {
                Ok(r) => r,
                Err(e) if format!("{}", DisplayErrorContext(&e)).contains("NoSuchUpload") => {
                    return Ok(None)
                }
                Err(e) => {
                    return Err(anyhow!(
                        "listing the parts of {key}: {}",
                        DisplayErrorContext(&e)
                    ))
                }
            };
            for p in r.parts() {
                if let (Some(n), Some(size), Some(etag)) = (p.part_number(), p.size(), p.e_tag()) {
                    out.push((n, size, etag.to_string()));
                }
            }
            if r.is_truncated() == Some(true) {
                marker = r.next_part_number_marker().map(str::to_string);
                if marker.is_none() {
                    break;
                }
            } else {
                break;
            }
        }
        Ok(Some(out))
    }

    pub async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        n: i32,
        data: Bytes,
    ) -> Result<String> {
        let r = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(self.full(key))
            .upload_id(upload_id)
            .part_number(n)
            .body(ByteStream::from(data))
            .send()
            .await
            .map_err(|e| anyhow!("uploading part {n} of {key}: {}", DisplayErrorContext(&e)))?;
        r.e_tag()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("part {n} of {key}: no ETag"))
    }

    pub async fn complete(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<(i32, String)>,
    ) -> Result<()> {
        let parts = parts
            .into_iter()
            .map(|(n, etag)| CompletedPart::builder().part_number(n).e_tag(etag).build())
            .collect();
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(self.full(key))
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| {
                anyhow!(
                    "completing the upload of {key}: {}",
                    DisplayErrorContext(&e)
                )
            })?;
        Ok(())
    }

    pub async fn abort(&self, key: &str, upload_id: &str) {
        let _ = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(self.full(key))
            .upload_id(upload_id)
            .send()
            .await;
    }

    /// Server-side copy of `key` (of `size` bytes) from `src`, another bucket on the same
    /// endpoint: CopyObject up to the single-copy limit (5 GiB), UploadPartCopy in 512 MiB
    /// ranges above it.
    pub async fn copy_from(&self, src: &S3Native, key: &str, size: u64) -> Result<()> {
        let single_max = std::env::var("JFS_SYNC_SINGLE_COPY_MAX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5u64 << 30);
        if size > single_max {
            return self
                .copy_parts(src, key, size, (512u64 << 20).min(single_max.max(5 << 20)))
                .await;
        }
        self.copy_object(src, key).await
    }

    async fn copy_parts(&self, src: &S3Native, key: &str, size: u64, part: u64) -> Result<()> {
        let source = format!("{}/{}", src.bucket, encode_path(&src.full(key)));
        let id = self.create(key).await?;
        let res: Result<Vec<(i32, String)>> = async {
            let mut parts = Vec::new();
            for (i, off) in (0..size).step_by(part as usize).enumerate() {
                let end = (off + part).min(size) - 1;
                let r = self
                    .client
                    .upload_part_copy()
                    .bucket(&self.bucket)
                    .key(self.full(key))
                    .upload_id(&id)
                    .part_number(i as i32 + 1)
                    .copy_source(&source)
                    .copy_source_range(format!("bytes={off}-{end}"))
                    .customize()
                    // Some servers (Ceph RGW) insist on Content-Length on this empty-body PUT.
                    .mutate_request(|r| {
                        r.headers_mut().insert("content-length", "0");
                    })
                    .send()
                    .await
                    .map_err(|e| {
                        anyhow!(
                            "server-side copy of part {} of {key}: {}",
                            i + 1,
                            DisplayErrorContext(&e)
                        )
                    })?;
                let etag = r
                    .copy_part_result()
                    .and_then(|c| c.e_tag())
                    .ok_or_else(|| anyhow!("{key}: part copy gave no ETag"))?;
                parts.push((i as i32 + 1, etag.to_string()));
            }
            Ok(parts)
        }
        .await;
        match res {
            Ok(parts) => self.complete(key, &id, parts).await,
            Err(e) => {
                self.abort(key, &id).await;
                Err(e)
            }
        }
    }

    async fn copy_object(&self, src: &S3Native, key: &str) -> Result<()> {
        let source = format!("{}/{}", src.bucket, encode_path(&src.full(key)));
        self.client
            .copy_object()
            .bucket(&self.bucket)
            .key(self.full(key))
            .copy_source(source)
            .send()
            .await
            .map_err(|e| anyhow!("server-side copy of {key}: {}", DisplayErrorContext(&e)))
            .context("CopyObject")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_source_encoding_keeps_slashes() {
        assert_eq!(super::encode_path("a b/ü+x"), "a%20b/%C3%BC%2Bx");
    }
}
