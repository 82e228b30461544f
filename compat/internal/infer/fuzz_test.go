package infer

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/loops-dev/loops/backends/tiny"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// FuzzPrompts drives the chat-template and tokenizer path (prompts: the byte bound, the
// chat template, bounded tokenizing) with any messages, prefill, text prompt and token
// limit, over loops/tiny's tokenizer and four chat templates (loops/tiny's, Qwen2.5's,
// a Mistral-style one that raises on bad role order, and Qwen3's structure). It never
// panics; an error is a 4xx *Error, and a context_length_exceeded one is true (the text
// is over the byte bound, or encodes to more than limit tokens); an answer is within the
// limit and is exactly the rendered text's encoding.
func FuzzPrompts(f *testing.F) {
	f.Setenv("HF_HUB_CACHE", f.TempDir())
	dir := f.TempDir()
	if err := tiny.Write(dir); err != nil {
		f.Fatal(err)
	}
	base, err := loadText(&loopsv1.ModelInfo{Name: tiny.Name, TokenizerId: dir})
	if err != nil {
		f.Fatal(err)
	}
	qwen3, err := os.ReadFile("testdata/qwen3_style.jinja")
	if err != nil {
		f.Fatal(err)
	}
	texts := []*Text{base}
	for _, src := range []string{qwenTemplate, mistralTemplate, string(qwen3)} {
		tmpl, err := compileTemplate(src)
		if err != nil {
			f.Fatal(err)
		}
		tx := *base
		tx.tmpl, tx.bos, tx.eos = tmpl, "<s>", "</s>"
		texts = append(texts, &tx)
	}
	for _, s := range []string{
		"user\x00Hi",
		"system\x00Be brief.\x01user\x00What is 2+2?\x01assistant\x00<think>\nhmm\n</think>\n\nFour.\x01user\x00again",
		"user\x00<|im_start|><|im_end|><|endoftext|>{{ x }}{% if %}",
		"assistant\x00first\x01user\x00\xff\xfe naïve 🙂",
		"user\x00" + strings.Repeat("a", 3000),
	} {
		for _, limit := range []uint16{0, 1, 16, 2048} {
			f.Add(s, "prefill", "prompt", limit, uint8(len(s)))
		}
	}
	f.Fuzz(func(t *testing.T, conv, prefill, prompt string, limit uint16, which uint8) {
		tx := texts[int(which)%len(texts)]
		var msgs []Message
		for _, m := range strings.Split(conv, "\x01") {
			role, content, _ := strings.Cut(m, "\x00")
			msgs = append(msgs, Message{Role: role, Content: content})
		}
		req := &Request{Messages: msgs, Prefill: prefill, Prompts: []Prompt{{Text: prompt}}}
		lim := int(limit)
		out, _, err := prompts(tx, &loopsv1.ModelInfo{Name: tiny.Name, MaxSequenceLength: int32(lim)}, req)
		if err != nil {
			var ae *Error
			if !errors.As(err, &ae) || ae.Status < 400 || ae.Status >= 500 || ae.Message == "" {
				t.Fatalf("not a client error: %#v", err)
			}
			if ae.Code != "context_length_exceeded" {
				return
			}
			if lim == 0 {
				t.Fatalf("over a limit with none: %v", err)
			}
			contents := len(prefill)
			for _, m := range msgs {
				contents += len(m.Content)
			}
			switch ae.Param {
			case "messages":
				if len(msgs) > lim || int64(contents) > tx.MaxBytes(lim) {
					return
				}
				rendered, rerr := tx.Render(msgs, nil)
				if rerr != nil {
					t.Fatalf("refused as too long, but does not render: %v", rerr)
				}
				if n := len(tx.Encode(rendered + prefill)); n <= lim {
					t.Fatalf("messages of %d tokens refused under a limit of %d: %v", n, lim, err)
				}
			case "prompt":
				if int64(len(prompt)) <= tx.MaxBytes(lim) && len(tx.Encode(prompt)) <= lim {
					t.Fatalf("a prompt of %d tokens refused under a limit of %d: %v", len(tx.Encode(prompt)), lim, err)
				}
			default:
				t.Fatalf("too long, naming %q", ae.Param)
			}
			return
		}
		if len(out) != 2 {
			t.Fatalf("%d prompts for messages and one prompt", len(out))
		}
		rendered, err := tx.Render(msgs, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range []string{rendered + prefill, prompt} {
			want := tx.Encode(s)
			if lim > 0 && len(out[i]) > lim {
				t.Fatalf("prompt %d: %d tokens accepted under a limit of %d", i, len(out[i]), lim)
			}
			if len(want) != len(out[i]) {
				t.Fatalf("prompt %d: %d tokens, Encode gives %d", i, len(out[i]), len(want))
			}
			for k := range want {
				if want[k] != out[i][k] {
					t.Fatalf("prompt %d: token %d differs from Encode's", i, k)
				}
			}
		}
	})
}

// FuzzSafeLen: the streamed part of a text is a prefix of it, never shows a stop sequence,
// and holds back at most an incomplete character (3 bytes) plus the start of a stop
// sequence.
func FuzzSafeLen(f *testing.F) {
	f.Add("hello wor", "world", "\n")
	f.Add("caf\xc3", "", "")
	f.Add("a\x80\x80\x80\x80", "x", "")
	f.Add("ok \ufffd", "", "")
	f.Add("0000000000", "00001", "00001") // two stops each ending the text: hold back the longer start once
	f.Fuzz(func(t *testing.T, s, stop1, stop2 string) {
		var stop []string
		longest := 0
		for _, st := range []string{stop1, stop2} {
			if st != "" {
				stop = append(stop, st)
				longest = max(longest, len(st))
			}
		}
		n := safeLen(s, stop)
		if n < 0 || n > len(s) {
			t.Fatalf("safeLen %d of %d bytes", n, len(s))
		}
		cut := len(cutStop(s, stop))
		if n > cut {
			t.Fatalf("%q: %d bytes sent, past the stop sequence at %d", s, n, cut)
		}
		if n == len(cutStop(s, stop)) || cut < len(s) {
			return
		}
		if held := len(s) - n; held > 3+max(longest-1, 0) {
			t.Fatalf("%q with stops %q: %d bytes held back", s, stop, held)
		}
	})
}
