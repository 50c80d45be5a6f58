//! The record formats of Amazon S3, MinIO and Ceph RGW, shaped as their documentation shows
//! them, each turned into an announce.

use super::*;

fn attrs(a: &v1::AnnounceRequest) -> std::collections::BTreeMap<String, String> {
    a.metadata
        .iter()
        .map(|at| {
            let v = match at.value.as_ref().and_then(|v| v.kind.as_ref()) {
                Some(v1::value::Kind::Text(t)) => t.clone(),
                Some(v1::value::Kind::Integer(i)) => format!("#{i}"),
                other => format!("{other:?}"),
            };
            (at.name.clone(), v)
        })
        .collect()
}

fn one(body: &str) -> v1::AnnounceRequest {
    let mut v = announces(body.as_bytes()).expect("a notification");
    assert_eq!(v.len(), 1);
    v.remove(0).expect("a record")
}

/// Amazon S3's event message structure (version 2.1): the key URL-encoded.
const AWS: &str = r#"{"Records":[{"eventVersion":"2.1","eventSource":"aws:s3",
 "awsRegion":"us-west-2","eventTime":"1970-01-01T00:00:00.000Z","eventName":"ObjectCreated:Put",
 "userIdentity":{"principalId":"AIDAJDPLRKLG7UEXAMPLE"},
 "requestParameters":{"sourceIPAddress":"127.0.0.1"},
 "responseElements":{"x-amz-request-id":"C3D13FE58DE4C810","x-amz-id-2":"FMyUVURIY8/IgAtTv8xRjskZQpcIZ9KG4V5Wp6S7S/JRWeUWerMUE5JgHvANOjpD"},
 "s3":{"s3SchemaVersion":"1.0","configurationId":"testConfigRule",
  "bucket":{"name":"amzn-s3-demo-bucket","ownerIdentity":{"principalId":"A3NL1KOZZKExample"},"arn":"arn:aws:s3:::amzn-s3-demo-bucket"},
  "object":{"key":"photos/HappyFace+%281%29.jpg","size":1024,"eTag":"d41d8cd98f00b204e9800998ecf8427e",
   "versionId":"096fKKXTRTtl3on89fVO.nfljtsv6qko","sequencer":"0055AED6DCD90281E5"}}}]}"#;

/// MinIO's webhook body: its own top-level fields, `s3:` in the event name, user metadata as
/// a map with the `X-Amz-Meta-` prefix, and the content type.
const MINIO: &str = r#"{"EventName":"s3:ObjectCreated:Put","Key":"images/cam%201.jpg",
 "Records":[{"eventVersion":"2.0","eventSource":"minio:s3","awsRegion":"",
 "eventTime":"2024-05-01T10:00:00.000Z","eventName":"s3:ObjectCreated:Put",
 "userIdentity":{"principalId":"minioadmin"},
 "requestParameters":{"principalId":"minioadmin","region":"","sourceIPAddress":"10.0.0.12"},
 "responseElements":{"x-amz-request-id":"17C9A8F8E1D3B0A1","x-minio-origin-endpoint":"http://10.0.0.5:9000"},
 "s3":{"s3SchemaVersion":"1.0","configurationId":"Config",
  "bucket":{"name":"images","ownerIdentity":{"principalId":"minioadmin"},"arn":"arn:aws:s3:::images"},
  "object":{"key":"cam%201.jpg","size":52311,"eTag":"0e1bb2a6c2d6f8f1e5f3b2b5f1e3a9c7",
   "contentType":"image/jpeg","userMetadata":{"X-Amz-Meta-Site":"kr/seoul","content-type":"image/jpeg"},
   "sequencer":"17C9A8F8E2A1C5D3"}},
 "source":{"host":"10.0.0.12","port":"","userAgent":"MinIO (linux; amd64) minio-go/v7.0.70"}}]}"#;

/// Ceph RGW's event record: the size as a string, metadata and tags as key/val lists, the key
/// not encoded.
const CEPH: &str = r#"{"Records":[{"eventVersion":"2.1","eventSource":"ceph:s3",
 "awsRegion":"us-east-1","eventTime":"2019-11-22T13:47:35.124724Z","eventName":"ObjectCreated:Put",
 "userIdentity":{"principalId":"tester"},"requestParameters":{"sourceIPAddress":""},
 "responseElements":{"x-amz-request-id":"503a4c37-85eb-47cd-8681-2817e80b4281.5330.903595","x-amz-id-2":"14d2-zone1-zonegroup1"},
 "s3":{"s3SchemaVersion":"1.0","configurationId":"mynotif1",
  "bucket":{"name":"mybucket1","ownerIdentity":{"principalId":"tester"},"arn":"arn:aws:s3:us-east-1::mybucket1","id":"503a4c37-85eb-47cd-8681-2817e80b4281.5332.38"},
  "object":{"key":"my image+1.jpg","size":"1024","eTag":"37b51d194a7513e45b56f6524f2d51f2","versionId":"",
   "sequencer":"F7E6D75DC742D108","metadata":[{"key":"x-amz-meta-color","val":"blue"}],
   "tags":[{"key":"team","val":"vision"}]}},
 "eventId":"1575221657.102001.80dad3aad8584778352c68ea4e8a5d77","opaqueData":"me@example.com"}]}"#;

#[test]
fn an_amazon_s3_record_becomes_an_announce() {
    let a = one(AWS);
    assert_eq!(
        a.external_id,
        "s3://amzn-s3-demo-bucket/photos/HappyFace (1).jpg"
    );
    let m = attrs(&a);
    assert_eq!(m["s3.event"], "ObjectCreated:Put");
    assert_eq!(m["s3.source"], "aws:s3");
    assert_eq!(m["s3.region"], "us-west-2");
    assert_eq!(m["s3.bucket"], "amzn-s3-demo-bucket");
    assert_eq!(m["s3.key"], "photos/HappyFace (1).jpg");
    assert_eq!(m["s3.size"], "#1024");
    assert_eq!(m["s3.etag"], "d41d8cd98f00b204e9800998ecf8427e");
    assert_eq!(m["s3.version_id"], "096fKKXTRTtl3on89fVO.nfljtsv6qko");
    assert_eq!(m["s3.source_ip"], "127.0.0.1");
    assert!(a.message_id.starts_with("s3:") && a.message_id.len() == 67);
    // the same record twice is one message id; another sequencer is another
    assert_eq!(one(AWS).message_id, a.message_id);
    let later = AWS.replace("0055AED6DCD90281E5", "0055AED6DCD90281E6");
    assert_ne!(one(&later).message_id, a.message_id);
}

#[test]
fn a_minio_record_becomes_an_announce() {
    let a = one(MINIO);
    assert_eq!(a.external_id, "s3://images/cam 1.jpg");
    let m = attrs(&a);
    assert_eq!(
        m["s3.event"], "ObjectCreated:Put",
        "the s3: prefix is dropped"
    );
    assert_eq!(m["s3.source"], "minio:s3");
    assert!(!m.contains_key("s3.region"), "an empty region is left out");
    assert_eq!(m["s3.size"], "#52311");
    assert_eq!(m["s3.content_type"], "image/jpeg");
    assert_eq!(m["s3.meta.site"], "kr/seoul");
    assert!(
        !m.contains_key("s3.meta.content-type"),
        "only x-amz-meta- entries"
    );
    assert_eq!(m["s3.source_ip"], "10.0.0.12");
}

#[test]
fn a_ceph_record_becomes_an_announce() {
    let a = one(CEPH);
    assert_eq!(
        a.external_id, "s3://mybucket1/my image+1.jpg",
        "Ceph keys are not encoded"
    );
    let m = attrs(&a);
    assert_eq!(m["s3.source"], "ceph:s3");
    assert_eq!(m["s3.size"], "#1024", "a string size is a number");
    assert_eq!(m["s3.meta.color"], "blue");
    assert_eq!(m["s3.tag.team"], "vision");
    assert!(!m.contains_key("s3.version_id"), "empty");
    assert!(!m.contains_key("s3.source_ip"), "empty");
}

/// What a Ceph 16.2.15 radosgw POSTed for a `CopyObject` (recorded from a real one, the
/// body of `tests/tests/ceph.rs`'s writer): the request's headers (`x-amz-content-sha256`,
/// `x-amz-copy-source`, `x-amz-date`) listed beside the user's `x-amz-meta-*` entries, one
/// of which has a header's name after its prefix.
const CEPH16_COPY: &str = include_str!("ceph16_copy.json");

#[test]
fn ceph_request_headers_are_not_user_metadata() {
    let a = one(CEPH16_COPY);
    assert_eq!(a.external_id, "s3://bkt3/copies/cam 1.jpg");
    let m = attrs(&a);
    assert_eq!(m["s3.event"], "ObjectCreated:Copy");
    assert_eq!(m["s3.size"], "#10");
    assert_eq!(m["s3.meta.site"], "kr/seoul");
    assert_eq!(
        m["s3.meta.x-amz-date"], "mine",
        "the user's, not the header's"
    );
    let meta: Vec<&String> = m.keys().filter(|k| k.starts_with("s3.meta.")).collect();
    assert_eq!(meta, ["s3.meta.site", "s3.meta.x-amz-date"], "{m:?}");
    assert_eq!(m["s3.tag.team"], "vision");
}

#[test]
fn bad_notifications_and_records_are_named() {
    let e = announces(b"not json").expect_err("not JSON");
    assert!(e.to_string().starts_with("body: not JSON"), "{e}");
    let e = announces(br#"{"records": []}"#).expect_err("no Records");
    assert_eq!(
        e.to_string(),
        "Records: missing: not an S3 event notification"
    );
    let e = announces(br#"{"Records": {}}"#).expect_err("not an array");
    assert!(e.to_string().contains("expected an array"), "{e}");
    let many = format!(
        r#"{{"Records": [{}]}}"#,
        vec!["{}"; MAX_RECORDS + 1].join(",")
    );
    assert!(announces(many.as_bytes()).is_err());
    let body = AWS.replace(
        r#""key":"photos/HappyFace+%281%29.jpg""#,
        r#""key":"bad%zz""#,
    );
    let r = announces(body.as_bytes()).expect("a notification");
    assert_eq!(
        r[0].as_ref().expect_err("broken escape").to_string(),
        "Records[0].s3.object.key: a broken URL encoding"
    );
    let body = AWS.replace(r#""size":1024"#, r#""size":-1"#);
    let r = announces(body.as_bytes()).expect("a notification");
    assert!(
        r[0].as_ref()
            .expect_err("size")
            .path
            .ends_with("s3.object.size")
    );
    let r = announces(br#"{"Records": [{"eventName": "ObjectCreated:Put"}, 5]}"#).expect("doc");
    assert_eq!(
        r[0].as_ref().expect_err("bucket").to_string(),
        "Records[0].s3.bucket.name: missing"
    );
    assert_eq!(
        r[1].as_ref().expect_err("not an object").to_string(),
        "Records[1]: expected an event record object"
    );
}

#[test]
fn url_decoding() {
    assert_eq!(url_decode("a+b%2Fc%C3%A9").as_deref(), Some("a b/cé"));
    assert_eq!(url_decode("%"), None);
    assert_eq!(url_decode("%4"), None);
    assert_eq!(url_decode("%ff"), None, "not UTF-8");
}

/// A token where each store can put it: a bearer header, Basic auth's password, the path,
/// the query; a malformed credential is named.
#[test]
fn a_token_is_taken_from_a_header_the_path_or_the_query() {
    let h = |v: &str| {
        let mut m = http::HeaderMap::new();
        m.insert(http::header::AUTHORIZATION, v.parse().expect("header"));
        m
    };
    let none = http::HeaderMap::new();
    let uri = |u: &str| u.parse::<http::Uri>().expect("uri");
    let got = |m: &http::HeaderMap, u: &str| presented_token(m, &uri(u));
    assert_eq!(got(&h("Bearer dsm_1"), "/"), Ok(Some("dsm_1".into())));
    // base64("ceph:dsm_2")
    assert_eq!(
        got(&h("Basic Y2VwaDpkc21fMg=="), "/"),
        Ok(Some("dsm_2".into()))
    );
    assert_eq!(got(&none, "/s3-events/dsm_3"), Ok(Some("dsm_3".into())));
    assert_eq!(
        got(&none, "/s3-events?a=b&token=dsm_4"),
        Ok(Some("dsm_4".into()))
    );
    assert_eq!(got(&none, "/s3-events"), Ok(None));
    // a header wins over the URL
    assert_eq!(
        got(&h("Bearer dsm_1"), "/s3-events/x"),
        Ok(Some("dsm_1".into()))
    );
    assert!(got(&h("Basic !!"), "/").is_err());
    // base64("no-colon")
    assert!(got(&h("Basic bm8tY29sb24="), "/").is_err());
    assert!(got(&h("Digest x"), "/").is_err());
    assert!(got(&none, "/s3-events/%zz").is_err());
    assert!(endpoint_path("/s3-events/t") && endpoint_path("/") && endpoint_path("/s3-events"));
    assert!(
        !endpoint_path("/s3-events/") && !endpoint_path("/s3-events/a/b") && !endpoint_path("/x")
    );
}
