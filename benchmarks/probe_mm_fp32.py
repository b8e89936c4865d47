import torch
a=torch.randn(256,512,device='cuda',dtype=torch.bfloat16); b=torch.randn(512,128,device='cuda',dtype=torch.bfloat16)
acc=torch.zeros(256,128,device='cuda')
ref=(a.float()@b.float())
for name,f in (("mm out_dtype out=", lambda: torch.mm(a,b,out_dtype=torch.float32,out=acc)),
               ("addmm out_dtype out=self", lambda: torch.addmm(acc,a,b,out_dtype=torch.float32,out=acc)),
               ("addmm out_dtype", lambda: torch.addmm(acc,a,b,out_dtype=torch.float32))):
    try:
        acc.zero_(); r=f(); torch.cuda.synchronize()
        print(name, "ok", r.dtype, float((r-ref).norm()/ref.norm()), r.data_ptr()==acc.data_ptr())
    except Exception as e: print(name, "FAIL", type(e).__name__, str(e)[:200])
acc.copy_(ref)
try:
    torch.addmm(acc,a,b,out_dtype=torch.float32,out=acc); torch.cuda.synchronize(); print("accumulate", float((acc-2*ref).norm()/ref.norm()))
except Exception as e: print("accumulate FAIL", e)
