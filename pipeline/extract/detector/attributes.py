"""The bottom-up-attention box predictor: Fast R-CNN class/box outputs plus an attribute head.

The attribute head of Anderson et al. embeds the predicted class (argmax over all C+1 logits,
background included), concatenates the embedding to the pooled region feature, and maps it
through ``fc_attr`` + ReLU + ``attr_score`` to A+1 attribute logits. Its parameters live inside
the box predictor, under the names used by the caffe-converted detectron2 checkpoint:
``roi_heads.box_predictor.{cls_embedding, fc_attr, attr_score}``. That conversion follows
detectron2's convention throughout: background is the LAST class logit (and embedding row), and
"no attribute" the last attribute logit.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from detectron2.config import configurable
from detectron2.modeling.roi_heads.fast_rcnn import FastRCNNOutputLayers


class AttributeFastRCNNOutputLayers(FastRCNNOutputLayers):
    """``FastRCNNOutputLayers`` with the attribute head beside ``cls_score`` / ``bbox_pred``.

    ``forward`` keeps detectron2's contract (class logits [R, C+1], box deltas [R, C*4]) so
    training losses and inference are unchanged; :meth:`attribute_logits` adds the attributes.
    With a D-dim input the class embedding is D/8 wide and the hidden layer D/4 (256 and 512 for
    the 2048-d R101-C4 head).
    """

    @configurable
    def __init__(self, input_shape, *, num_attributes: int, **kwargs):
        super().__init__(input_shape, **kwargs)
        dim = input_shape.channels * (input_shape.width or 1) * (input_shape.height or 1)
        self.num_attributes = num_attributes
        self.cls_embedding = nn.Embedding(self.num_classes + 1, dim // 8)
        self.fc_attr = nn.Linear(dim + dim // 8, dim // 4)
        self.attr_score = nn.Linear(dim // 4, num_attributes + 1)
        nn.init.normal_(self.cls_embedding.weight, std=0.01)
        for layer in (self.fc_attr, self.attr_score):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.constant_(layer.bias, 0.0)

    @classmethod
    def from_config(cls, cfg, input_shape):
        ret = super().from_config(cfg, input_shape)
        ret["num_attributes"] = cfg.MODEL.UNITER.NUM_ATTRIBUTES
        return ret

    def attribute_logits(self, features: torch.Tensor, class_logits: torch.Tensor) -> torch.Tensor:
        """features [R, D], class_logits [R, C+1] (background last) -> attribute logits [R, A+1]."""
        x = torch.cat([features, self.cls_embedding(class_logits.argmax(dim=1))], dim=1)
        return self.attr_score(F.relu(self.fc_attr(x)))
