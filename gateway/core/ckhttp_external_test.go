package core_test

import (
	"net/http"

	"github.com/loops-dev/loops/gateway/ckhttp"
	"github.com/loops-dev/loops/gateway/core"
)

func init() {
	core.ArchiveHandler = func(c *core.Core) http.Handler { return ckhttp.New(c, ckhttp.Options{}).Archives() }
}
