package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/loops-dev/loops/gateway/ckstore"
)

// workerStoreOptions adds to the torch backend's options what its workers need to reach
// a --checkpoint-store: its folder (allow_dirs), when it is a folder (the workers read and
// write the data dir already), or the scheme://host[:port] of its presigned URLs
// (checkpoint_origins), when it is S3 (asked of the store itself: the host it signs for,
// which is the endpoint's, or the bucket's own host on AWS). An option set by the operator,
// as a --backend-opt or its environment variable, is kept.
func workerStoreOptions(ctx context.Context, cks ckstore.Store, opts map[string]string) error {
	if cks == nil {
		return nil
	}
	if _, ok := cks.(ckstore.LocalDirs); ok {
		if opts["allow_dirs"] == "" && os.Getenv("LOOPS_WORKER_ALLOW_DIRS") == "" {
			opts["allow_dirs"] = cks.String()
		}
		return nil
	}
	ups, ok := cks.(ckstore.Uploads)
	if !ok || opts["checkpoint_origins"] != "" || os.Getenv("LOOPS_WORKER_CHECKPOINT_ORIGINS") != "" {
		return nil
	}
	// a URL signed locally (nothing is read): its origin is every URL's
	m := &ckstore.Manifest{Version: 1, Generation: "origin", Files: []ckstore.File{{Name: "probe"}}}
	urls, err := ups.DownloadURLs(ctx, "loops/origin-probe", m, time.Minute)
	if err != nil {
		return fmt.Errorf("--checkpoint-store: signing a URL: %w", err)
	}
	u, err := url.Parse(urls["probe"])
	if err != nil || u.Host == "" {
		return fmt.Errorf("--checkpoint-store: the store signs URLs the workers cannot use (%q)", urls["probe"])
	}
	opts["checkpoint_origins"] = u.Scheme + "://" + u.Host
	return nil
}
