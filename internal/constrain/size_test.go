package constrain

import (
	"testing"
	"time"
)

func TestSizes(t *testing.T) {
	t0 := time.Now()
	a := JSONObject()
	t.Logf("json_object: %d states, %d classes, %d bytes, %v", a.States(), a.nclass, a.Size(), time.Since(t0))
	t0 = time.Now()
	b, err := Schema([]byte(`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string","enum":["a","b"]}},"x":{"anyOf":[{"type":"number"},{"type":"null"}]}},"required":["name","age","tags","x"],"additionalProperties":false}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("schema: %d states, %v", b.States(), time.Since(t0))
}
