"""Triton Python-backend model `dot_product_attention`: attnserve's model, in PyTorch.

queries (B, Lq, d), keys (B, Lk, d), values (B, Lk, v) FP32 and optional
valid_lens INT32 -> output (B, Lq, v) FP32, by
torch.nn.functional.scaled_dot_product_attention (scale 1/sqrt(d), as
attnserve's default).

valid_lens is turned into a boolean mask the way the textbook's masked softmax
(Dive into Deep Learning, the attention chapter) means it: key j takes part in
row i of batch entry b when j < valid_lens[b] (shape (B,) or (B, 1)), or
j < valid_lens[b, i] (shape (B, Lq)). The textbook fills masked scores with
-1e6, so a row with valid length 0 is a uniform average over all keys; here
such a row keeps every key too (SDPA with an all-False row would give NaN).
(attnserve itself answers zeros for a row of valid length 0; the benchmark's
data has lengths >= 1.)

One intra-op thread (ATTNSERVE_PEERS_TORCH_THREADS overrides), as attnserve's
--kernel_threads=1 default: the benchmark pins each server to one core.
"""
import os

import torch
import torch.nn.functional as F
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        threads = int(os.environ.get("ATTNSERVE_PEERS_TORCH_THREADS", "1"))
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set in this process
            pass

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as e:  # noqa: BLE001 - reported to the client
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(str(e))))
        return responses

    def _one(self, request):
        q = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "queries").as_numpy())
        k = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "keys").as_numpy())
        v = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "values").as_numpy())
        mask = None
        lens_tensor = pb_utils.get_input_tensor_by_name(request, "valid_lens")
        if lens_tensor is not None:
            lens = torch.from_numpy(lens_tensor.as_numpy()).reshape(q.shape[0], -1)
            if lens.shape[1] not in (1, q.shape[1]):
                raise ValueError(f"valid_lens: shape {tuple(lens_tensor.as_numpy().shape)}, "
                                 f"want ({q.shape[0]},), ({q.shape[0]}, 1) or "
                                 f"({q.shape[0]}, {q.shape[1]})")
            positions = torch.arange(k.shape[1])
            # (B, 1 or Lq, Lk): True where the key takes part.
            mask = positions < lens.unsqueeze(-1)
            mask |= (lens == 0).unsqueeze(-1)  # the textbook's uniform row
        with torch.inference_mode():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("output", out.contiguous().numpy())])
