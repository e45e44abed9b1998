"""The checkpoint bucket: versioned, encrypted, private, old versions expired."""
from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra import iam
from infra.resources import children_options

ABORT_INCOMPLETE_UPLOADS_DAYS = 7


class CheckpointStore(pulumi.ComponentResource):
    """Protected from destroy while `retain` (the bucket and its checkpoints outlive the stack)."""

    def __init__(self, name: str, *, bucket: str | None, bucket_prefix: str, retain: bool,
                 noncurrent_version_expiration_days: int, tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        """`bucket` names the bucket; without it, a name is generated from `bucket_prefix`."""
        super().__init__("raytrain:infra:CheckpointStore", name, None, opts)
        child = children_options(self, opts)

        bucket_args = {"bucket": bucket} if bucket else {"bucket_prefix": bucket_prefix}
        self.bucket = aws.s3.Bucket(
            f"{name}-bucket", force_destroy=not retain, tags=tags, **bucket_args,
            # A generated name is kept: bucketPrefix follows the cluster's name, and a rename would replace
            # the bucket (bucket_prefix is ForceNew) and, unretained, delete every checkpoint.
            opts=pulumi.ResourceOptions(parent=self, protect=retain, retain_on_delete=retain,
                                        ignore_changes=None if bucket else ["bucketPrefix"]))
        aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access", bucket=self.bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=child)
        versioning = aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=self.bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"), opts=child)
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=self.bucket.id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms"),
                bucket_key_enabled=True)], opts=child)
        # Ray deletes old checkpoints; in a versioned bucket each lives on as a noncurrent version,
        # billed until a rule expires it, and the delete markers left behind need cleaning too.
        everything = aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix="")
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle", bucket=self.bucket.id,
            rules=[
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="abort-incomplete-multipart-uploads", status="Enabled", filter=everything,
                    abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=ABORT_INCOMPLETE_UPLOADS_DAYS)),
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-deleted-checkpoints", status="Enabled", filter=everything,
                    noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=noncurrent_version_expiration_days),
                    expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(
                        expired_object_delete_marker=True)),
            ],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[versioning])))
        aws.s3.BucketPolicy(f"{name}-tls-only", bucket=self.bucket.id,
                            policy=self.bucket.arn.apply(iam.deny_insecure_transport), opts=child)
        self.uri = self.bucket.bucket.apply(lambda b: f"s3://{b}")
        self.register_outputs({"bucketUri": self.uri})
