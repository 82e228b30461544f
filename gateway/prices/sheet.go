package prices

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/money"
)

// Bounds on a sheet, checked before it is used: its size in bytes and the entries it may
// list.
const (
	MaxFileBytes  = 1 << 20
	maxEntries    = 10000
	maxNameLen    = 512
	tokensPerUnit = 1_000_000 // token prices are per million tokens
	secondsPerHr  = 3600
	// byteSecondsPerGBMonth is a GB-month of checkpoint storage in byte-seconds: a GB is
	// 1e9 bytes and a month 730 hours (365 days / 12, as cloud storage bills it).
	byteSecondsPerGBMonth = 1_000_000_000 * 730 * secondsPerHr
	// priceDigits is the most decimal places a price may have.
	priceDigits = 6
)

// Price is one price in a sheet: a decimal USD amount, unset when the sheet leaves it out.
type Price struct {
	set bool
	usd money.USD
}

// UnmarshalYAML reads a price from a string or number scalar, keeping its line for errors.
func (p *Price) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" || n.Tag == "!!bool" {
		return fmt.Errorf("line %d: want a price in USD such as \"2.50\"", n.Line)
	}
	v, err := money.ParseUSD(strings.TrimSpace(n.Value), priceDigits)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	if v < 0 {
		return fmt.Errorf("line %d: %q: a price may not be negative", n.Line, n.Value)
	}
	*p = Price{set: true, usd: v}
	return nil
}

// ModelPrices are a base model's prices in USD per million tokens.
type ModelPrices struct {
	Prefill       Price `yaml:"prefill"`
	CachedPrefill Price `yaml:"cached_prefill"`
	Sample        Price `yaml:"sample"`
	Train         Price `yaml:"train"`
}

// Prices is a price list: the top of a sheet, or a workspace's own.
type Prices struct {
	Models         map[string]ModelPrices `yaml:"models"`
	StorageGBMonth Price                  `yaml:"storage_gb_month"`
	GPUHour        map[string]Price       `yaml:"gpu_hour"`
}

// File is a price sheet as written.
type File struct {
	Prices     `yaml:",inline"`
	Workspaces map[string]Prices `yaml:"workspaces"`
}

// Sheet is a parsed, validated price sheet with its version.
type Sheet struct {
	version string
	base    Prices
	ws      map[string]Prices
}

// Parse parses and validates a sheet's contents (YAML or JSON), loaded at the given time.
// Errors name the line or the field.
func Parse(data []byte, loaded time.Time) (*Sheet, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("the price sheet is %d bytes, more than the %d allowed", len(data), MaxFileBytes)
	}
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s (the keys are models, storage_gb_month, gpu_hour and workspaces; a model takes prefill, cached_prefill, sample and train)", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("the price sheet holds more than one YAML document: keep one")
	}
	if err := f.Prices.validate(""); err != nil {
		return nil, err
	}
	if len(f.Workspaces) > maxEntries {
		return nil, fmt.Errorf("workspaces: %d entries, more than the %d allowed", len(f.Workspaces), maxEntries)
	}
	for _, name := range slices.Sorted(maps.Keys(f.Workspaces)) {
		if err := auth.ValidateWorkspaceName(name); err != nil {
			return nil, fmt.Errorf("workspaces: %q is not a workspace name: use 1 to %d letters, digits, '_' or '-', not starting with '-'", name, auth.MaxWorkspaceNameLen)
		}
		if err := f.Workspaces[name].validate("workspaces." + name + "."); err != nil {
			return nil, err
		}
	}
	sum := sha256.Sum256(data)
	return &Sheet{
		version: "sha256:" + hex.EncodeToString(sum[:6]) + "@" + loaded.UTC().Format(time.RFC3339),
		base:    f.Prices,
		ws:      f.Workspaces,
	}, nil
}

func (p Prices) validate(at string) error {
	if len(p.Models) > maxEntries || len(p.GPUHour) > maxEntries {
		return fmt.Errorf("%smodels or gpu_hour: more than %d entries", at, maxEntries)
	}
	for name := range p.Models {
		if name == "" || len(name) > maxNameLen {
			return fmt.Errorf("%smodels: %q: a model name has 1 to %d bytes (\"*\": any other model)", at, name, maxNameLen)
		}
	}
	for kind := range p.GPUHour {
		if kind == "" || len(kind) > maxNameLen {
			return fmt.Errorf("%sgpu_hour: %q: a GPU kind has 1 to %d bytes (\"*\": any other kind)", at, kind, maxNameLen)
		}
	}
	return nil
}

// Version is the sheet's version: its content hash and load time.
func (s *Sheet) Version() string {
	if s == nil {
		return ""
	}
	return s.version
}

// model is the prices of model under p: its own entry, else the "*" entry.
func (p Prices) model(model string) ModelPrices {
	if m, ok := p.Models[model]; ok {
		return m
	}
	return p.Models["*"]
}

func (p Prices) gpu(kind string) Price {
	if v, ok := p.GPUHour[kind]; ok && kind != "" {
		return v
	}
	return p.GPUHour["*"]
}

// or is p when set, else q.
func (p Price) or(q Price) Price {
	if p.set {
		return p
	}
	return q
}

// rate is the price in force for a workspace's usage of kind on model (gpuKind for
// dedicated GPU time), and whether there is one.
func (s *Sheet) rate(ws, model, kind, gpuKind string) Price {
	if s == nil {
		return Price{}
	}
	own := s.ws[ws]
	switch kind {
	case store.UsageTraining:
		return own.model(model).Train.or(s.base.model(model).Train)
	case store.UsageSamplingPrefill:
		return own.model(model).Prefill.or(s.base.model(model).Prefill)
	case UsageCachedPrefill:
		return own.model(model).CachedPrefill.or(s.base.model(model).CachedPrefill)
	case store.UsageSamplingSample:
		return own.model(model).Sample.or(s.base.model(model).Sample)
	case store.UsageDedicatedGPUSeconds:
		return own.gpu(gpuKind).or(s.base.gpu(gpuKind))
	case store.UsageCheckpointByteSeconds:
		return own.StorageGBMonth.or(s.base.StorageGBMonth)
	}
	return Price{}
}

// UsageCachedPrefill is the usage kind of prompt tokens served from a prefix cache, priced
// at cached_prefill.
const UsageCachedPrefill = store.UsageSamplingCachedPrefill

// Cost is what amount of kind (a store.Usage* kind) costs a workspace on model (gpuKind
// for dedicated GPU-seconds) under the sheet, and whether the sheet prices it: false for
// a nil sheet and for usage the sheet has no price for. Tokens cost the price per million
// exactly; GPU-seconds cost the GPU-hour price prorated and rounded half up to the
// pico-dollar, and checkpoint byte-seconds the GB-month price prorated (a GB-month is 1e9
// bytes for 730 hours) and rounded the same way.
func (s *Sheet) Cost(ws, model, kind, gpuKind string, amount int64) (money.USD, bool, error) {
	p := s.rate(ws, model, kind, gpuKind)
	if !p.set {
		return 0, false, nil
	}
	var (
		c   money.USD
		err error
	)
	switch kind {
	case store.UsageDedicatedGPUSeconds:
		c, err = money.MulDiv(p.usd, amount, secondsPerHr)
	case store.UsageCheckpointByteSeconds:
		c, err = money.MulDiv(p.usd, amount, byteSecondsPerGBMonth)
	default:
		// A price with at most 6 decimals per million tokens is a whole number of
		// pico-dollars per token.
		c, err = money.Mul(p.usd/tokensPerUnit, amount)
	}
	if err != nil {
		return 0, false, fmt.Errorf("pricing %d of %s on %s: %w", amount, kind, model, err)
	}
	return c, true, nil
}

// Rate is the price in force for kind on model in a workspace as a decimal USD amount per
// unit (per million tokens, per GPU-hour), and whether there is one.
func (s *Sheet) Rate(ws, model, kind, gpuKind string) (money.USD, bool) {
	p := s.rate(ws, model, kind, gpuKind)
	return p.usd, p.set
}
