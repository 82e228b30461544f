package ckstore_test

import (
	"fmt"
	"testing"

	"github.com/loops-dev/loops/gateway/ckstore/ckstoretest"
	"github.com/loops-dev/loops/gateway/ckstore/s3test"
)

func TestS3Contract(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	bucket := srv.NewBucket(t)
	n := 0
	ckstoretest.Run(t, func(t *testing.T) string {
		n++
		return fmt.Sprintf("s3://%s/loops/case-%d", bucket, n)
	})
}
