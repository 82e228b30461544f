package catalog

import loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"

// Entry is a model's catalog entry as the compatible routes write it: the fields a client
// of the route's own API ignores (the tinker SDK reads model_name, the openai client id,
// object, created and owned_by; both keep the rest).
type Entry struct {
	Family            string   `json:"family,omitempty"`
	Publisher         string   `json:"publisher,omitempty"`
	RendererName      string   `json:"renderer_name,omitempty"`
	LoraTargets       []string `json:"lora_targets,omitempty"`
	Modalities        []string `json:"modalities,omitempty"`
	MaxSequenceLength int32    `json:"max_sequence_length,omitempty"`
	MaxLoraRank       int32    `json:"max_lora_rank,omitempty"`
	Trainable         bool     `json:"trainable"`
	Sampleable        bool     `json:"sampleable"`
	Availability      []string `json:"availability,omitempty"`
	Backend           string   `json:"backend,omitempty"`
}

// Of returns model m's entry, as the caller's workspace sees it (ListModels).
func Of(m *loopsv1.ModelInfo) *Entry {
	return &Entry{
		Family: m.GetFamily(), Publisher: m.GetPublisher(), RendererName: m.GetRenderer(),
		LoraTargets: m.GetLoraTargets(), Modalities: m.GetModalities(),
		MaxSequenceLength: m.GetMaxSequenceLength(), MaxLoraRank: m.GetMaxLoraRank(),
		Trainable: m.GetTrainable(), Sampleable: m.GetSampleable(),
		Availability: m.GetAvailability(), Backend: m.GetBackend(),
	}
}

// Weights returns the entry of sampler weights trained on base model m (a checkpoint, a
// deployment's model): the base model's, sampleable, not trainable (a run trains the base
// model; it may load the weights' training state).
func Weights(m *loopsv1.ModelInfo) *Entry {
	e := Of(m)
	e.Trainable, e.Sampleable = false, true
	return e
}
