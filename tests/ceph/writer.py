"""The writer of the Ceph round-trip test (tests/tests/ceph.rs): configures a bucket
notification topic on a radosgw whose push endpoint is dissem's S3 event listener, then
writes objects with boto3 as a user would. Prints one JSON line per write: what was written
(bucket, key, size, user metadata, tags) for the test to compare with what dissem delivers.

usage: writer.py RGW_URL ACCESS_KEY SECRET_KEY PUSH_ENDPOINT BUCKET
"""
import json
import sys

import boto3
from botocore.config import Config


def main():
    rgw, access, secret, endpoint, bucket = sys.argv[1:6]
    opts = dict(retries={"max_attempts": 3}, s3={"addressing_style": "path"})
    try:
        # botocore 1.36+ streams bodies with a trailing checksum that Ceph 16 refuses
        # (MissingContentLength); older ones have no such setting
        cfg = Config(request_checksum_calculation="when_required",
                     response_checksum_validation="when_required", **opts)
    except TypeError:
        cfg = Config(**opts)
    kw = dict(endpoint_url=rgw, aws_access_key_id=access, aws_secret_access_key=secret,
              region_name="default", config=cfg)
    s3 = boto3.client("s3", **kw)
    sns = boto3.client("sns", **kw)
    s3.create_bucket(Bucket=bucket)
    # Ceph 16: a topic's push endpoint takes no headers; the token travels in the URL
    arn = sns.create_topic(Name=bucket + "-dissem", Attributes={
        "push-endpoint": endpoint, "persistent": "false", "verify-ssl": "false",
    })["TopicArn"]
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={
        "TopicConfigurations": [{
            "Id": "dissem", "TopicArn": arn,
            "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
        }],
    })
    writes = [
        ("photos/cam 1.jpg", b"jpeg bytes", {"site": "kr/seoul", "x-amz-date": "mine"}, "team=vision"),
        ("docs/a+b%c.txt", b"", {"owner": "dana"}, None),
        ("unicode/서울.bin", b"\x00\x01\x02" * 100, {"site": "kr/busan"}, "team=maps&tier=gold"),
    ]
    for key, body, meta, tags in writes:
        args = dict(Bucket=bucket, Key=key, Body=body, Metadata=meta)
        if tags:
            args["Tagging"] = tags
        s3.put_object(**args)
        print(json.dumps({"event": "put", "bucket": bucket, "key": key, "size": len(body),
                          "meta": meta, "tags": dict(t.split("=") for t in tags.split("&")) if tags else {}}),
              flush=True)
    # a copy (Ceph lists the request's x-amz-copy-source beside the metadata) and a
    # multipart upload
    s3.copy_object(Bucket=bucket, Key="copies/cam 1.jpg",
                   CopySource={"Bucket": bucket, "Key": "photos/cam 1.jpg"})
    print(json.dumps({"event": "copy", "bucket": bucket, "key": "copies/cam 1.jpg", "size": 10,
                      "meta": {"site": "kr/seoul", "x-amz-date": "mine"}, "tags": {"team": "vision"}}),
          flush=True)
    up = s3.create_multipart_upload(Bucket=bucket, Key="big/part.bin", Metadata={"site": "kr/daegu"})
    part = s3.upload_part(Bucket=bucket, Key="big/part.bin", UploadId=up["UploadId"], PartNumber=1,
                          Body=b"p" * 1024)
    s3.complete_multipart_upload(Bucket=bucket, Key="big/part.bin", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    print(json.dumps({"event": "multipart", "bucket": bucket, "key": "big/part.bin", "size": 1024,
                      "meta": {"site": "kr/daegu"}, "tags": {}}), flush=True)
    s3.delete_object(Bucket=bucket, Key="docs/a+b%c.txt")
    print(json.dumps({"event": "delete", "bucket": bucket, "key": "docs/a+b%c.txt"}), flush=True)


if __name__ == "__main__":
    main()
