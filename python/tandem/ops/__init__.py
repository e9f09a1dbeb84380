"""torch-facing ops (torch.library ops defined by schema: tandem.ops._runtime.define_op). Inputs are validated before anything is launched; every
failure is a TandemError (a ValueError-like INVALID_ARGUMENT for bad input) naming the op and the argument.

    import tandem.ops
    d = torch.ops.tandem.gemm(a, b)          # the Hopper GEMM core (world 1)
    d = torch.ops.tandem.scaled_gemm(a8, b8, scale_a, scale_b)  # FP8 e4m3 with scales, bf16 out (torch._scaled_mm's)
    c = tandem.ops.ag_gemm(comm, a_local, b) # all_gather(a_local) @ b, one fused kernel
    o = tandem.ops.gemm_rs(comm, a, b)       # reduce_scatter(a @ b), one fused kernel
    y, lay = tandem.ops.moe_dispatch_gemm(comm, x, ids, w)  # MoE dispatch + the experts' GEMM, one kernel
    o, lse = tandem.ops.ring_attention(comm, q, k, v, causal=True)  # attention over the sequence sharded by rank
"""

from __future__ import annotations

from .gemm import gemm, scaled_gemm  # noqa: F401  (registers torch.ops.tandem.gemm / scaled_gemm)
from .tp import ag_gemm, gemm_ar, gemm_rs  # noqa: F401,E402  (registers torch.ops.tandem.ag_gemm / gemm_rs / gemm_ar)
from .tp import scaled_ag_gemm, scaled_gemm_ar, scaled_gemm_rs  # noqa: F401,E402  (FP8 e4m3 with scales; the unfused path)
from .moe import moe_combine, moe_dispatch_gemm  # noqa: F401,E402  (registers torch.ops.tandem.moe_*)
from .moe_layer import moe_ffn  # noqa: F401,E402  (the MoE layer as one op: torch.ops.tandem.moe_ffn)
from .attention import (  # noqa: F401,E402  (registers torch.ops.tandem.ring_attention)
    contiguous_shard, ring_attention, zigzag_shard, zigzag_unshard)
# the TP ops' backward (torch.library.register_autograd) and the ops it uses: all_gather_rows, ag_gemm_gathered,
# sp_bias_add
from . import tp_autograd  # noqa: F401,E402
# ring attention's backward (torch.ops.tandem.ring_attention_backward, registered as ring_attention's autograd)
from . import attention_backward  # noqa: F401,E402
# the MoE layer's backward (torch.ops.tandem.moe_ffn_backward, registered as moe_ffn's autograd)
from . import moe_backward  # noqa: F401,E402
