package ckstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config says where an S3-compatible store is and how to reach it.
type S3Config struct {
	// Endpoint is the server's URL ("https://host[:port]" or "http://…"); empty means AWS
	// S3 (s3.amazonaws.com).
	Endpoint string
	// Region is the bucket's region; empty means "us-east-1" with a custom endpoint, and
	// the bucket's location, looked up, with AWS.
	Region string
	// AccessKey, SecretKey and SessionToken are static credentials; with AccessKey empty,
	// credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN,
	// then the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE), then
	// the instance or pod role (IAM, web identity).
	AccessKey, SecretKey, SessionToken string
	// Bucket must exist.
	Bucket string
	// Prefix is prepended, with a slash, to every object name; empty for none.
	Prefix string
}

// S3ConfigFromEnv reads the endpoint and region from the usual AWS environment variables:
// AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL; AWS_REGION, else AWS_DEFAULT_REGION.
// Credentials are left to the chain described at S3Config.AccessKey.
func S3ConfigFromEnv() (S3Config, error) {
	var c S3Config
	c.Endpoint = os.Getenv("AWS_ENDPOINT_URL_S3")
	if c.Endpoint == "" {
		c.Endpoint = os.Getenv("AWS_ENDPOINT_URL")
	}
	c.Region = os.Getenv("AWS_REGION")
	if c.Region == "" {
		c.Region = os.Getenv("AWS_DEFAULT_REGION")
	}
	return c, nil
}

// NewS3 returns the store in an S3-compatible bucket. It checks that the bucket exists
// and that the credentials may read it. Large files are uploaded in parallel multipart
// parts; a killed multipart upload leaves invisible parts that the bucket's lifecycle
// rule AbortIncompleteMultipartUpload should remove (the store never lists them).
func NewS3(ctx context.Context, cfg S3Config, opts Options) (Store, error) {
	if cfg.Bucket == "" {
		return nil, fmt.Errorf("%w: S3 checkpoint store needs a bucket: s3://bucket/prefix", ErrInvalid)
	}
	cfg.Prefix = strings.Trim(cfg.Prefix, "/")
	if err := validPrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("S3 prefix: %w", err)
	}
	host, secure := "s3.amazonaws.com", true
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("%w: S3 endpoint %q: want http(s)://host[:port]", ErrInvalid, cfg.Endpoint)
		}
		host, secure = u.Host, u.Scheme == "https"
		if cfg.Region == "" {
			cfg.Region = "us-east-1"
		}
	}
	var creds *credentials.Credentials
	if cfg.AccessKey != "" {
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken)
	} else {
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{},
			&credentials.FileAWSCredentials{Profile: os.Getenv("AWS_PROFILE")},
			&credentials.IAM{},
		})
	}
	client, err := minio.New(host, &minio.Options{Creds: creds, Secure: secure, Region: cfg.Region})
	if err != nil {
		return nil, fmt.Errorf("ckstore: S3 client: %w", err)
	}
	o := &s3Objects{c: client, bucket: cfg.Bucket, prefix: cfg.Prefix, where: "s3://" + cfg.Bucket + "/" + cfg.Prefix}
	ok, err := client.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("ckstore: checking bucket %s at %s: %w", cfg.Bucket, host, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: bucket %s does not exist at %s", ErrInvalid, cfg.Bucket, host)
	}
	return s3Store{newObjStore(o, opts)}, nil
}

// s3Objects keeps objects in a bucket under a prefix.
type s3Objects struct {
	c      *minio.Client
	bucket string
	prefix string
	where  string
}

func (s *s3Objects) String() string { return s.where }

func (s *s3Objects) object(name string) string {
	if s.prefix == "" {
		return name
	}
	return s.prefix + "/" + name
}

func (s *s3Objects) put(ctx context.Context, name string, r io.Reader, size int64) error {
	_, err := s.c.PutObject(ctx, s.bucket, s.object(name), r, size, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	return err
}

func (s *s3Objects) putFile(ctx context.Context, name, src string, size int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	// An *os.File is an io.ReaderAt, so minio-go uploads large files in parallel parts
	// read straight from the file.
	return s.put(ctx, name, f, size)
}

func (s *s3Objects) get(ctx context.Context, name string) (io.ReadCloser, error) {
	// One GET whose body is the object: minio.Client.GetObject would send a second,
	// conditional request for the body, which fails when the object is replaced between
	// the two.
	body, _, _, err := minio.Core{Client: s.c}.GetObject(ctx, s.bucket, s.object(name), minio.GetObjectOptions{})
	if err != nil {
		return nil, s3Err(name, err)
	}
	return s3Reader{body, name}, nil
}

// s3Reader maps the errors of reads that fail because the object was removed meanwhile
// to ErrNotFound.
type s3Reader struct {
	io.ReadCloser
	name string
}

func (r s3Reader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = s3Err(r.name, err)
	}
	return n, err
}

func s3Err(name string, err error) error {
	switch minio.ToErrorResponse(err).Code {
	case minio.NoSuchKey, "NotFound":
		return fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	return err
}

func (s *s3Objects) list(ctx context.Context, prefix string, fn func(string, time.Time) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine when fn fails
	full := s.object(prefix)
	if prefix == "" && s.prefix != "" {
		full = s.prefix + "/"
	}
	strip := len(full) - len(prefix)
	for obj := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: full, Recursive: true}) {
		if obj.Err != nil {
			return obj.Err
		}
		if len(obj.Key) < strip || strings.HasSuffix(obj.Key, "/") {
			continue
		}
		if err := fn(obj.Key[strip:], obj.LastModified); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (s *s3Objects) remove(ctx context.Context, names ...string) error {
	var errs []error
	for _, name := range names {
		if err := s.c.RemoveObject(ctx, s.bucket, s.object(name), minio.RemoveObjectOptions{}); err != nil {
			if errors.Is(s3Err(name, err), ErrNotFound) {
				continue
			}
			errs = append(errs, fmt.Errorf("removing %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

func (s *s3Objects) url(ctx context.Context, name string, ttl time.Duration) (string, error) {
	u, err := s.c.PresignedGetObject(ctx, s.bucket, s.object(name), ttl, nil)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}
