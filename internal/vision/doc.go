// Package vision checks the images of a model input before any work is done on them: the
// encoded bytes (size and format), the pixel size read from the image's header (never by
// decoding its pixels), and how many tokens the model's image processor makes of it
// (Qwen-VL's smart_resize, from the model's loopsv1.VisionInfo). Both the Tinker routes
// (compat) and the core's request checks (gateway/core/validate) use it, so an image that is
// truncated, of the wrong format or too large is a 400 that names the limit and never
// reaches a worker.
package vision
