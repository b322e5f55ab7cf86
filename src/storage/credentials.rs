//! Where a remote store's endpoint, region and keys come from: the
//! environment variables and files the vendors' own tools read.
//!
//! - `s3://`: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//!   `AWS_SESSION_TOKEN`, `AWS_REGION` (or `AWS_DEFAULT_REGION`),
//!   `AWS_ENDPOINT_URL_S3` (or `AWS_ENDPOINT_URL`, `AWS_ENDPOINT`); else the
//!   profile `AWS_PROFILE` (default `default`) of
//!   `AWS_SHARED_CREDENTIALS_FILE` (default `~/.aws/credentials`) and of
//!   `AWS_CONFIG_FILE` (default `~/.aws/config`: `region`, `endpoint_url`).
//! - `oss://`: `OSS_ENDPOINT`, `OSS_ACCESS_KEY_ID`, `OSS_ACCESS_KEY_SECRET`,
//!   `OSS_SESSION_TOKEN`, `OSS_REGION`; else ossutil's config file
//!   (`OSS_CONFIG_FILE`, default `~/.ossutilconfig`, section
//!   `[Credentials]`: `endpoint`, `accessKeyID`, `accessKeySecret`,
//!   `stsToken`), which EasyRec's documentation has users write.
//!   Alibaba's own endpoints (`*.aliyuncs.com`) are addressed
//!   virtual-hosted style (`bucket.endpoint`), as OSS requires; another
//!   endpoint (an S3-compatible gateway) path style.

use std::collections::HashMap;
use std::path::PathBuf;

/// What a bucket's client is built with.
#[derive(Debug, Clone, PartialEq)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: String,
    pub keys: Option<(String, String)>,
    pub token: Option<String>,
    pub virtual_hosted: bool,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn home() -> Option<PathBuf> {
    env("HOME").map(PathBuf::from)
}

/// The `key = value` lines of section `section` of an INI file (keys
/// lower-cased); empty when the file or section is missing.
fn ini_section(path: Option<PathBuf>, section: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return out;
    };
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
        } else if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
    }
    out
}

/// An access key and its secret from two environment variables (both or
/// neither), else from two keys of a credentials file's section.
fn key_pair(
    (id_var, secret_var): (&str, &str),
    (file, id_key, secret_key): (&HashMap<String, String>, &str, &str),
) -> Result<Option<(String, String)>, String> {
    match (env(id_var), env(secret_var)) {
        (Some(id), Some(secret)) => Ok(Some((id, secret))),
        (Some(_), None) | (None, Some(_)) => Err(format!("{id_var} and {secret_var} must be set together")),
        (None, None) => Ok(file
            .get(id_key)
            .zip(file.get(secret_key))
            .map(|(id, secret)| (id.clone(), secret.clone()))),
    }
}

/// An endpoint without a scheme is HTTPS.
fn with_scheme(e: String) -> String {
    if e.contains("://") {
        e
    } else {
        format!("https://{e}")
    }
}

pub fn s3(_bucket: &str) -> Result<S3Settings, String> {
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let creds = ini_section(
        env("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from)
            .or_else(|| home().map(|h| h.join(".aws/credentials"))),
        &profile,
    );
    let config_section = if profile == "default" {
        "default".to_string()
    } else {
        format!("profile {profile}")
    };
    let config = ini_section(
        env("AWS_CONFIG_FILE")
            .map(PathBuf::from)
            .or_else(|| home().map(|h| h.join(".aws/config"))),
        &config_section,
    );
    let keys = key_pair(
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        (&creds, "aws_access_key_id", "aws_secret_access_key"),
    )?;
    let token = if env("AWS_ACCESS_KEY_ID").is_some() {
        env("AWS_SESSION_TOKEN")
    } else {
        creds.get("aws_session_token").cloned()
    };
    let endpoint = env("AWS_ENDPOINT_URL_S3")
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .or_else(|| env("AWS_ENDPOINT"))
        .or_else(|| config.get("endpoint_url").cloned())
        .map(with_scheme);
    let region = env("AWS_REGION")
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .or_else(|| config.get("region").cloned())
        .unwrap_or_else(|| "us-east-1".into());
    Ok(S3Settings {
        endpoint,
        region,
        keys,
        token,
        virtual_hosted: false,
    })
}

pub fn oss(bucket: &str) -> Result<S3Settings, String> {
    let file = ini_section(
        env("OSS_CONFIG_FILE")
            .map(PathBuf::from)
            .or_else(|| home().map(|h| h.join(".ossutilconfig"))),
        "Credentials",
    );
    let endpoint = env("OSS_ENDPOINT")
        .or_else(|| file.get("endpoint").cloned())
        .map(with_scheme)
        .ok_or("no OSS endpoint: set OSS_ENDPOINT (oss-<region>.aliyuncs.com) or `endpoint` in ~/.ossutilconfig")?;
    let keys = key_pair(
        ("OSS_ACCESS_KEY_ID", "OSS_ACCESS_KEY_SECRET"),
        (&file, "accesskeyid", "accesskeysecret"),
    )?;
    let token = env("OSS_SESSION_TOKEN").or_else(|| file.get("ststoken").cloned());
    let (scheme, host) = endpoint.split_once("://").unwrap_or(("https", &endpoint));
    let host = host.trim_end_matches('/');
    let alibaba = host.ends_with(".aliyuncs.com");
    // oss-cn-hangzhou.aliyuncs.com (or oss-cn-hangzhou-internal...) signs as region oss-cn-hangzhou.
    let region = env("OSS_REGION").unwrap_or_else(|| {
        let first = host.split('.').next().unwrap_or("");
        match first.strip_suffix("-internal") {
            Some(r) => r.to_string(),
            None if first.starts_with("oss-") => first.to_string(),
            None => "us-east-1".into(),
        }
    });
    Ok(S3Settings {
        endpoint: Some(if alibaba {
            format!("{scheme}://{bucket}.{host}")
        } else {
            endpoint.clone()
        }),
        region,
        keys,
        token,
        virtual_hosted: alibaba,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_sections_are_read_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c");
        std::fs::write(
            &p,
            "[default]\naws_access_key_id = A\n[profile x]\nregion=eu-west-1\n[Credentials]\naccessKeyID=K\n",
        )
        .unwrap();
        assert_eq!(ini_section(Some(p.clone()), "default")["aws_access_key_id"], "A");
        assert_eq!(ini_section(Some(p.clone()), "profile x")["region"], "eu-west-1");
        assert_eq!(ini_section(Some(p.clone()), "Credentials")["accesskeyid"], "K");
        assert!(ini_section(Some(p), "missing").is_empty());
        assert!(ini_section(None, "default").is_empty());
    }
}
