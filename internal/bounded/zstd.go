package bounded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

// MaxStreamWindow is the largest zstd window accepted for a body whose frames do not all
// declare their content size (those are decoded through a window buffer of that size):
// 8 MiB, the window the zstd format recommends every decoder support, and what levels up to
// 19 use. Frames that declare their size are decoded in place and may use any window up to
// the body's limit.
const MaxStreamWindow = 8 << 20

// zstdBlockMax is the most one zstd block produces (Block_Maximum_Size); a frame that lies
// about its content size is caught within one block, so that much slack keeps its output
// buffer from ever being reallocated.
const zstdBlockMax = 128 << 10

// Zstd decompresses a zstd body that may decompress to at most limit bytes. It reserves the
// memory in b (waiting at most until ctx ends or the budget's wait passes) before allocating
// anything, allocates the output once, and keeps the reservation until the output has been
// garbage collected. Errors are *TooLargeError, *CorruptError or wrap ErrBusy.
func Zstd(ctx context.Context, raw []byte, limit int64, b *Budget) ([]byte, error) {
	declared, window, err := scanZstd(raw)
	if err != nil {
		return nil, &CorruptError{Encoding: "zstd", Err: err}
	}
	if declared > limit {
		return nil, tooLarge(limit)
	}
	if declared >= 0 {
		return zstdDeclared(ctx, raw, declared, limit, b)
	}
	if window > MaxStreamWindow {
		return nil, &TooLargeError{Limit: MaxStreamWindow, Reason: fmt.Sprintf(
			"the zstd body uses a %d-byte window; frames that do not declare their content size may use at most %d bytes (compress at level 19 or lower without --long, or write the content size)",
			window, MaxStreamWindow)}
	}
	window = max(window, zstd.MinWindowSize)

	// First pass: count what the body decompresses to, keeping nothing but the window.
	hold, err := b.Acquire(ctx, int64(window))
	if err != nil {
		return nil, err
	}
	n, err := zstdStream(raw, limit, window, nil)
	hold.Release()
	if err != nil {
		return nil, err
	}
	// Second pass: decode into a buffer of exactly that size.
	if hold, err = b.Acquire(ctx, n+int64(window)); err != nil {
		return nil, err
	}
	out := make([]byte, n, n+1)
	hold.ReleaseWhenCollected(&out[:1][0])
	if _, err := zstdStream(raw, n, window, out); err != nil {
		return nil, err
	}
	return out, nil
}

// zstdDeclared decodes a body whose frames declare n bytes in all, in place: the output
// buffer is the decoder's window, so it needs no other memory.
func zstdDeclared(ctx context.Context, raw []byte, n, limit int64, b *Budget) ([]byte, error) {
	hold, err := b.Acquire(ctx, n+zstdBlockMax)
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		// The output is the window here, so any window is free; the declared sizes, checked
		// after every block, bound the output.
		zstd.WithDecoderMaxMemory(zstd.MaxWindowSize),
		zstd.WithDecoderMaxWindow(zstd.MaxWindowSize))
	if err != nil {
		hold.Release()
		return nil, &CorruptError{Encoding: "zstd", Err: err}
	}
	defer dec.Close()
	buf := make([]byte, 0, n+zstdBlockMax)
	hold.ReleaseWhenCollected(&buf[:1][0])
	out, err := dec.DecodeAll(raw, buf)
	if err == nil && int64(len(out)) != n {
		err = fmt.Errorf("the frames declare %d bytes but hold %d", n, len(out))
	}
	if err != nil {
		return nil, zstdError(err, limit)
	}
	return out, nil
}

// zstdStream decodes raw through a window of at most window bytes. With out == nil it
// counts the output, failing past limit; otherwise it fills out, which must be exactly the
// output's size.
func zstdStream(raw []byte, limit int64, window uint64, out []byte) (int64, error) {
	dec, err := zstd.NewReader(bytes.NewReader(raw),
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		// The decoder caps its window at its max memory: the limit is enforced on the
		// output here, so that cap must not refuse a window the limit is smaller than.
		zstd.WithDecoderMaxMemory(max(uint64(limit), window)),
		zstd.WithDecoderMaxWindow(window))
	if err != nil {
		return 0, &CorruptError{Encoding: "zstd", Err: err}
	}
	defer dec.Close()
	if out == nil {
		n, err := io.Copy(io.Discard, io.LimitReader(dec, limit+1))
		if err == nil && n > limit {
			return n, tooLarge(limit)
		}
		if err != nil {
			return n, zstdError(err, limit)
		}
		return n, nil
	}
	if _, err := io.ReadFull(dec, out); err != nil {
		return 0, zstdError(fmt.Errorf("second pass: %w", err), limit)
	}
	var one [1]byte
	if m, err := dec.Read(one[:]); m != 0 || !errors.Is(err, io.EOF) {
		return 0, &CorruptError{Encoding: "zstd", Err: errors.New("the second pass decoded more than the first")}
	}
	return int64(len(out)), nil
}

func zstdError(err error, limit int64) error {
	if errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		return tooLarge(limit)
	}
	if errors.Is(err, zstd.ErrWindowSizeExceeded) {
		return &TooLargeError{Limit: limit, Reason: "the zstd body asks for a larger window than the server allows (" + err.Error() + ")"}
	}
	return &CorruptError{Encoding: "zstd", Err: err}
}

func tooLarge(limit int64) error {
	return &TooLargeError{Limit: limit, Reason: fmt.Sprintf("the body decompresses to more than the server's limit of %d bytes", limit)}
}

// scanZstd walks the frames of raw without decoding them. declared is the sum of their
// content sizes, or -1 when a frame does not declare one; window is the largest window a
// frame asks for (its content size for a single-segment frame). Skippable frames are
// skipped; a truncated frame or a block larger than the format allows is an error.
func scanZstd(raw []byte) (declared int64, window uint64, err error) {
	for len(raw) > 0 {
		var h zstd.Header
		rest, err := h.DecodeAndStrip(raw)
		if err != nil {
			return 0, 0, err
		}
		if h.Skippable {
			if uint64(len(rest)) < uint64(h.SkippableSize) {
				return 0, 0, io.ErrUnexpectedEOF
			}
			raw = rest[h.SkippableSize:]
			continue
		}
		w := h.WindowSize
		if h.SingleSegment {
			w = h.FrameContentSize
		}
		window = max(window, w)
		switch {
		case !h.HasFCS:
			declared = -1
		case declared >= 0:
			if h.FrameContentSize > uint64(1<<62)-uint64(declared) {
				declared = 1 << 62 // more than any limit
			} else {
				declared += int64(h.FrameContentSize)
			}
		}
		raw = rest
		for last := false; !last; {
			if len(raw) < 3 {
				return 0, 0, io.ErrUnexpectedEOF
			}
			bh := uint32(raw[0]) | uint32(raw[1])<<8 | uint32(raw[2])<<16
			last = bh&1 == 1
			size := int(bh >> 3)
			if size > zstdBlockMax {
				return 0, 0, fmt.Errorf("a block of %d bytes is larger than the format's %d", size, zstdBlockMax)
			}
			switch (bh >> 1) & 3 {
			case 1: // RLE: one byte repeated size times
				size = 1
			case 3:
				return 0, 0, errors.New("reserved block type")
			}
			if len(raw)-3 < size {
				return 0, 0, io.ErrUnexpectedEOF
			}
			raw = raw[3+size:]
		}
		if h.HasCheckSum {
			if len(raw) < 4 {
				return 0, 0, io.ErrUnexpectedEOF
			}
			raw = raw[4:]
		}
	}
	return declared, window, nil
}
