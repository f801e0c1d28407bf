#!/usr/bin/env python3
# src/cuda/hopper_fp8/check_in_place_transpose.py — a lane-by-lane model of the FP8
# kernel's V transposes (kernel.cuh): ldmatrix.x{2,4}.trans / stmatrix.x{2,4} and
# __byte_perm as the PTX ISA defines them, the kernel's swizzled addresses, the in-place
# schedule's items per warp (each warp's loads of an item before its stores, the warps
# in random order: their sets are disjoint) and the copy schedule's steps. Both must
# leave Vt row d, byte 32 kp + k' = V[32 kp + pi(k')][d] (kernel.cuh, point 2). The copy
# path is device-verified: its passing checks the model. The wide key tiles (d128 192/224
# keys: a V stage of two 128 x 128-byte squares; d64 160 keys: two 128-key panels of 8 KB;
# the rows past block_n stale bytes) must leave Vt panel kp / 128 (d x 128 bytes each), row
# d, byte kp % 128 = V[32 (kp / 32) + pi(kp % 32)][d] for every key byte kp < block_n.
# Run after changing the transpose's addressing:
# python3 src/cuda/hopper_fp8/check_in_place_transpose.py
import random
import sys
def swz(P, off): return off ^ ((off >> 3) & ((P//16 - 1) << 4))
def pi(k): h, q, t = k//16, (k%16)//4, k%4; return 16*h + 8*(t//2) + 2*q + (t%2)
BN=128
def b16(mem, addr): return mem[addr] | (mem[addr+1] << 8)
def ldmatrix_trans(mem, addrs, n):  # addrs[lane]; returns regs[lane][i]
    regs=[[0]*n for _ in range(32)]
    for i in range(n):
        rows=[addrs[8*i+r] for r in range(8)]
        for t in range(32):
            col=t//4; r0=2*(t%4)
            lo=b16(mem, rows[r0]+2*col); hi=b16(mem, rows[r0+1]+2*col)
            regs[t][i]=lo | (hi<<16)
    return regs
def stmatrix(mem, addrs, regs, n):
    for i in range(n):
        rows=[addrs[8*i+r] for r in range(8)]
        for t in range(32):
            row=t//4; col=t%4
            v=regs[t][i]
            for b in range(4): mem[rows[row]+4*col+b]=(v>>(8*b))&0xff
def perm(x,y,s):
    bs=[(x>>(8*i))&0xff for i in range(4)]+[(y>>(8*i))&0xff for i in range(4)]
    return sum(bs[(s>>(4*i))&7]<<(8*i) for i in range(4))
ITEMS=[[(0,0,1,1),(0,1,1,0)],[(2,2,3,3),(2,3,3,2)],[(0,2,2,0),(1,3,3,1)],[(0,3,3,0),(1,2,2,1)]]
def run(D, block_n=BN):
    # block_n > 128 (d128 only): the stage holds 256 rows, those past block_n stale.
    P=min(D,128); panels=D//P; squares=panels*((block_n+127)//128); rows=128*((block_n+127)//128)
    V=[[random.randrange(256) for _ in range(D)] for _ in range(rows)]
    mem=[0]*(rows*D)
    for k in range(rows):
        for d in range(D): mem[(d//P)*rows*P + swz(P, k*P + d%P)] = V[k][d]
    def v_step_offset(lane,g,e):
        m,r=lane//8,lane%8; key=16*g+8*(m%2)+r; db=16*(2*e+m//2)
        return (db//P)*(BN*P)+swz(P,key*P+db%P)
    def vt_step_offset(lane,g,e):
        m,r=lane//8,lane%8; par=(m%2)^(1 if r>=4 else 0); drow=32*e+16*(m//2)+2*r+par
        return swz(128, drow*128+16*g)
    if P==128:
        LL=[swz(128,(l%16)*128) for l in range(32)]
        SL=[]
        for l in range(32):
            bl=l%16; par=(bl//8)^(1 if bl%8>=4 else 0); SL.append(swz(128,(2*(bl%8)+par)*128))
        sel=[0x7531 if l//4>=4 else 0x6420 for l in range(32)]
        def move(loads, stores):
            frs=[ldmatrix_trans(mem, loads[i], 2) for i in range(4)]
            for i in range(4):
                regs=[[perm(frs[i][l][0],frs[i][l][1],sel[l]), perm(frs[i][l][0],frs[i][l][1],sel[l]^0x1111)] for l in range(32)]
                stmatrix(mem, stores[i], regs, 2)
        order=list(range(4)); random.shuffle(order)  # warps in any order (disjoint sets)
        for w in order:
            for item in range(2*squares):
                a1,b1,a2,b2=ITEMS[w][item%2]; pa=16384*(item//2)
                if a1==b1:
                    for half in range(2):
                        a=a1 if half==0 else a2
                        l0=[pa+4096*a+(LL[l]^(32*a)) for l in range(32)]
                        l1=[pa+4096*a+(LL[l]^(32*a)^16) for l in range(32)]
                        s0=[pa+4096*a+(SL[l]^(32*a)) for l in range(32)]
                        s1=[pa+4096*a+(SL[l]^(32*a)^16) for l in range(32)]
                        move([l0,l1,[x+2048 for x in l0],[x+2048 for x in l1]],[s0,[x+2048 for x in s0],s1,[x+2048 for x in s1]])
                else:
                    for half in range(2):
                        bl=[pa+4096*a1+2048*half+(LL[l]^(32*b1)) for l in range(32)]
                        il=[pa+4096*b1+(LL[l]^(32*a1)^(16*half)) for l in range(32)]
                        bs=[pa+4096*b1+(SL[l]^(32*a1)^(16*half)) for l in range(32)]
                        iS=[pa+4096*a1+2048*half+(SL[l]^(32*b1)) for l in range(32)]
                        move([bl,[x^16 for x in bl],il,[x+2048 for x in il]],[bs,[x+2048 for x in bs],iS,[x^16 for x in iS]])
    else:  # d64: 128 keys (one Vt panel, 8 KB) at a time, every warp loads 4 steps, then all store
        LL=[v_step_offset(l,0,0) for l in range(32)]; SL=[vt_step_offset(l,0,0) for l in range(32)]
        for pa in range(0, rows*D, 128*D):
            allf={}
            for w in range(4):
                for i in range(4):
                    g,e=2*w+i%2,i//2
                    allf[(w,i)]=ldmatrix_trans(mem,[pa+16*P*g+(LL[l]^(32*e)) for l in range(32)],4)
            for w in range(4):
                for i in range(4):
                    g,e=2*w+i%2,i//2; f=allf[(w,i)]
                    regs=[]
                    for l in range(32):
                        sw=l//4>=4
                        ea=perm(f[l][0],f[l][1],0x6420); oa=perm(f[l][0],f[l][1],0x7531)
                        eb=perm(f[l][2],f[l][3],0x6420); ob=perm(f[l][2],f[l][3],0x7531)
                        regs.append([oa if sw else ea, ea if sw else oa, ob if sw else eb, eb if sw else ob])
                    stmatrix(mem,[pa+4096*e+(SL[l]^(16*g)) for l in range(32)],regs,4)
    bad=0
    for d in range(D):
        for kp in range(block_n):
            key=32*(kp//32)+pi(kp%32)
            if mem[128*D*(kp//128)+swz(128,d*128+kp%128)]!=V[key][d]: bad+=1
    return bad
random.seed(1)
failures = 0
for D in (64,128,256):
    bad = run(D)
    failures += bad
    print("in place", D, "mismatches:", bad)
for D, block_n in ((128, 192), (128, 224), (128, 256), (64, 160), (64, 256)):
    bad = run(D, block_n)
    failures += bad
    print("in place", D, "block_n", block_n, "mismatches:", bad)
# in_place_overlap's unrolled addresses ((tile + lane_offset) ^ C) + offset against the
# loop's tile + offset + (lane_offset ^ C), for 1024-aligned stage bases (kernel.cuh).
def overlap_address_mismatches():
    LL=[swz(128,(l%16)*128) for l in range(32)]
    SL=[]
    for l in range(32):
        bl=l%16; par=(bl//8)^(1 if bl%8>=4 else 0); SL.append(swz(128,(2*(bl%8)+par)*128))
    bad=0
    for tile in (0, 1024, 0x8400, 0x1c000, 0x37c00):
        for w in range(4):
            for item in range(4):
                a1,b1,a2,b2=ITEMS[w][item%2]; pa=16384*(item//2)
                for half in range(2):
                    for l in range(32):
                        lb, sb = tile+LL[l], tile+SL[l]
                        if a1==b1:
                            a=a1 if half==0 else a2; off=pa+4096*a
                            old=[tile+off+(LL[l]^(32*a)), tile+off+(LL[l]^(32*a)^16), tile+off+(SL[l]^(32*a)), tile+off+(SL[l]^(32*a)^16)]
                            new=[(lb^(32*a))+off, (lb^(32*a+16))+off, (sb^(32*a))+off, (sb^(32*a+16))+off]
                        else:
                            bo=pa+4096*a1+2048*half; io=pa+4096*b1
                            bl=tile+bo+(LL[l]^(32*b1)); il=tile+io+(LL[l]^(32*a1)^(16*half))
                            bs=tile+io+(SL[l]^(32*a1)^(16*half)); iS=tile+bo+(SL[l]^(32*b1))
                            old=[bl, bl^16, il, il+2048, bs, bs+2048, iS, iS^16]
                            new=[(lb^(32*b1))+bo, (lb^(32*b1+16))+bo, (lb^(32*a1+16*half))+io, (lb^(32*a1+16*half))+io+2048,
                                 (sb^(32*a1+16*half))+io, (sb^(32*a1+16*half))+io+2048, (sb^(32*b1))+bo, (sb^(32*b1+16))+bo]
                        bad += sum(x!=y for x,y in zip(old,new))
    return bad
bad = overlap_address_mismatches()
failures += bad
print("overlap addresses mismatches:", bad)
# The old copy transposer (device-verified) through the same emulation: checks the emulation.
def run_copy(D):
    P=min(D,128)
    V=[[random.randrange(256) for _ in range(D)] for _ in range(BN)]
    mem=[0]*(BN*D); out=[0]*(BN*D)
    for k in range(BN):
        for d in range(D): mem[(d//P)*BN*P + swz(P, k*P + d%P)] = V[k][d]
    for step in range(8*(D//32)):
        g,e=step%8,step//8
        addrs=[]; saddr=[]
        for l in range(32):
            m,r=l//8,l%8; key=16*g+8*(m%2)+r; db=16*(2*e+m//2)
            addrs.append((db//P)*(BN*P)+swz(P,key*P+db%P))
            par=(m%2)^(1 if r>=4 else 0); drow=32*e+16*(m//2)+2*r+par
            saddr.append(swz(128,drow*128+16*g))
        f=ldmatrix_trans(mem,addrs,4); regs=[]
        for l in range(32):
            sw=l//4>=4
            ea=perm(f[l][0],f[l][1],0x6420); oa=perm(f[l][0],f[l][1],0x7531)
            eb=perm(f[l][2],f[l][3],0x6420); ob=perm(f[l][2],f[l][3],0x7531)
            regs.append([oa if sw else ea, ea if sw else oa, ob if sw else eb, eb if sw else ob])
        stmatrix(out,saddr,regs,4)
    return sum(out[swz(128,d*128+kp)]!=V[32*(kp//32)+pi(kp%32)][d] for d in range(D) for kp in range(BN))
for D in (64,128,256):
    bad = run_copy(D)
    failures += bad
    print("copy", D, "mismatches:", bad)
sys.exit(1 if failures else 0)
