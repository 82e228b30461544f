"""Image inputs of a vision-language model: the model's own image processor (transformers,
Pillow backend) turns the images the gateway checked (loops.v1.Image: encoded bytes, their
size and token count) into the model's pixel_values and image_grid_thw.

The gateway has already bounded every image (bytes, header size, format, expected_tokens:
internal/vision); the worker checks again what it computes: the decoded size is the
header's, and the processor's token count is the chunk's."""

from __future__ import annotations

import io
import logging
import os
from typing import List, Optional, Sequence, Tuple

import torch

from .errors import invalid

log = logging.getLogger("loops_worker.vision")


class ImageInputs:
    """The image processor of one base model."""

    def __init__(self, proc, image_token_id: int, video_token_id: Optional[int]):
        self.proc = proc
        self.image_token_id = int(image_token_id)
        self.video_token_id = None if video_token_id is None else int(video_token_id)
        self.merge = int(proc.merge_size)

    @staticmethod
    def load(path: str, config) -> Tuple[Optional["ImageInputs"], str]:
        """The model's image processor, or None and why image chunks cannot be served."""
        if not os.path.isfile(os.path.join(path, "preprocessor_config.json")):
            return None, "the model folder has no preprocessor_config.json (the image processor's settings)"
        try:
            import PIL  # noqa: F401
        except ImportError:
            return None, "Pillow is not installed in the worker's environment (transformers' image processor needs it)"
        from transformers import AutoImageProcessor

        proc = AutoImageProcessor.from_pretrained(path, backend="pil")
        for a in ("patch_size", "merge_size", "temporal_patch_size", "size"):
            if getattr(proc, a, None) is None:
                return None, f"its image processor ({type(proc).__name__}) has no {a}: not a Qwen-VL processor"
        tok = getattr(config, "image_token_id", None)
        if tok is None:
            return None, "its config has no image_token_id"
        return ImageInputs(proc, tok, getattr(config, "video_token_id", None)), ""

    def info(self):
        from .proto import tpb

        size = self.proc.size
        return tpb.VisionInfo(patch_size=int(self.proc.patch_size), merge_size=self.merge,
                              min_pixels=int(size["shortest_edge"]), max_pixels=int(size["longest_edge"]),
                              image_token_id=self.image_token_id)

    def place(self, where: str, tokens: List[int], images: Sequence) -> Tuple[List[int], List[int]]:
        """The input ids with each image's placeholders replaced by the image token, and the
        modality of every position (0 text, 1 image; the model's mm_token_type_ids). A text
        token that is the image or video token is refused: the model would take it for an
        image position."""
        ids = list(tokens)
        kinds = [0] * len(ids)
        for k, im in enumerate(images):
            a, b = int(im.offset), int(im.offset) + int(im.tokens)
            if a < 0 or b > len(ids) or any(kinds[a:b]):
                raise invalid(f"{where}: image {k} at [{a}, {b}) is outside the input or overlaps another")
            for j in range(a, b):
                ids[j] = self.image_token_id
                kinds[j] = 1
        for j, (t, m) in enumerate(zip(ids, kinds)):
            if m == 0 and t in (self.image_token_id, self.video_token_id):
                raise invalid(f"{where}: token {t} at position {j} is the model's image/video placeholder token; "
                              f"send images as image chunks, not their token ids")
        return ids, kinds

    def pixels(self, where: str, images: Sequence) -> Tuple[torch.Tensor, torch.Tensor]:
        """pixel_values and image_grid_thw of images, in order, each checked against its chunk."""
        from PIL import Image

        pics = []
        for k, im in enumerate(images):
            try:
                pic = Image.open(io.BytesIO(im.data))
                pic.load()
            except Exception as e:  # noqa: BLE001 - PIL raises many kinds
                raise invalid(f"{where}: image {k} cannot be decoded: {e}")
            if pic.size != (int(im.width), int(im.height)):
                raise invalid(f"{where}: image {k} decodes to {pic.size[0]}×{pic.size[1]} pixels, not {im.width}×{im.height}")
            pics.append(pic.convert("RGB"))
        out = self.proc(images=pics, return_tensors="pt")
        grid = out["image_grid_thw"]
        for k, im in enumerate(images):
            n = int(grid[k].prod()) // (self.merge * self.merge)
            if n != int(im.tokens):
                raise invalid(f"{where}: image {k} has expected_tokens {im.tokens}, but the model's image processor makes {n} tokens of it")
        return out["pixel_values"], grid
