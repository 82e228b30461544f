package tiny

import (
	"bytes"
	"encoding/json"
	"io"
)

func jsonMarshal(v any) ([]byte, error)   { return json.Marshal(v) }
func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
func bytesReader(b []byte) io.Reader      { return bytes.NewReader(b) }
