"""torch._grouped_mm probe for moe_ffn's GEMM 2 (2D x 3D with int32 device offsets, bf16, sm90): unaligned and empty
groups, rows past the last offset, an offsets view of a larger int32 tensor, CUDA graph replay with offsets changed
on the device, a strided offsets tensor, I not a multiple of 8. Written by a reviewer of branch moe-ffn; run it on
the device before tests/gpu/test_moe.py -k ffn:  python3 tools/diag/grouped_mm_probe.py"""
import torch
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
d='cuda';bf=torch.bfloat16
def ref(a,w,ends):
    o=torch.zeros(a.shape[0],w.shape[2],device=d);s=0
    for j,e in enumerate(ends.tolist()):
        o[s:e]=a[s:e].float()@w[j].float();s=e
    return o,s
def run(cap,I,H,G,counts,tag):
    a=torch.randn(cap,I,device=d).to(bf);w=torch.randn(G,I,H,device=d).to(bf)/I**.5
    big=torch.zeros(1+G+G+1+7,dtype=torch.int32,device=d)
    off=torch.tensor([0]+list(torch.tensor(counts).cumsum(0)),dtype=torch.int32)
    big[1+G:1+G+G+1]=off.to(d); ends=big[1+G:1+G+G+1][1:]
    t=torch.full((cap,H),7.,dtype=bf,device=d);p=t.data_ptr();del t
    z=torch._grouped_mm(a,w,offs=ends);torch.cuda.synchronize()
    r,n=ref(a,w,ends)
    err=((z[:n].float()-r[:n]).norm()/r[:n].norm().clamp_min(1e-30)).item() if n else 0
    tail=z[n:]; reuse=z.data_ptr()==p
    print(tag,'shape',tuple(z.shape),'stride',z.stride(),'rel',round(err,5),'ends_ptr%16',ends.data_ptr()%16,'reused',reuse,'tail_all7',bool((tail==7).all()) if tail.numel() else None)
    return a,w,big,ends,z
run(200,136,256,4,[13,0,37,5],'unaligned+empty')
run(64,136,256,4,[0,0,0,0],'all_empty')
run(64,136,256,4,[0,0,0,64],'first3empty_full')
run(300,520,264,3,[1,2,3],'tiny')
run(4096,1024,2048,8,[511,0,1,900,77,3,0,1000],'big')
a,w,big,ends,_=run(200,136,256,4,[10,20,30,40],'pre')
s=torch.cuda.Stream();s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(2): torch._grouped_mm(a,w,offs=ends)
torch.cuda.current_stream().wait_stream(s)
g=torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g): zs=torch._grouped_mm(a,w,offs=ends)
    for c in ([10,20,30,40],[3,0,150,1],[0,0,0,0]):
        big[1+4:1+4+5]=torch.tensor([0]+list(torch.tensor(c).cumsum(0)),dtype=torch.int32,device=d)
        g.replay();torch.cuda.synchronize();r,n=ref(a,w,ends)
        print('graph',c,'rel',((zs[:n].float()-r[:n]).norm()/r[:n].norm().clamp_min(1e-30)).item() if n else 0)
except Exception as e: print('graph FAIL',type(e).__name__,str(e)[:300])
try: torch._grouped_mm(a,w,offs=big[1+4::2][:4]);print('strided offs accepted')
except Exception as e: print('strided offs',str(e)[:150])
try: torch._grouped_mm(a[:, :132].contiguous(),w[:, :132],offs=ends);print('I=132 accepted')
except Exception as e: print('I=132',str(e)[:150])
