"""A minimal, valid ELF64 AArch64 shared object, written byte by byte (no cross compiler exists here).

Stand-in for what the NDK's clang/lld produce for qnn-model-lib-generator's aarch64-android target.
It is real enough for `readelf -lW/-d/-S/--dyn-syms` and `file`: two PT_LOAD segments (R+X text and
read-only data, RW dynamic), PT_DYNAMIC, PT_GNU_STACK, a SysV hash table, .dynsym/.dynstr with the
model-lib entry points, DT_SONAME, and section headers. The LOAD alignment is the linker's
max-page-size: 0x1000 by default (NDK r26 links 4 KB pages), 0x4000 with -Wl,-z,max-page-size=16384.
The code is two stubs (`mov w0, #1; ret`): nothing here is meant to run on a phone.
"""
from __future__ import annotations

import struct

EM_AARCH64 = 183
PT_LOAD, PT_DYNAMIC, PT_GNU_STACK = 1, 2, 0x6474E551
PF_X, PF_W, PF_R = 1, 2, 4
SHT_PROGBITS, SHT_STRTAB, SHT_DYNAMIC, SHT_HASH, SHT_DYNSYM = 1, 3, 6, 5, 11
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4
DT_NULL, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT, DT_SONAME = 0, 4, 5, 6, 10, 11, 14
STB_GLOBAL, STT_FUNC, STT_OBJECT = 1, 2, 1
STUB = struct.pack("<II", 0x52800020, 0xD65F03C0)  # mov w0, #1 ; ret  (MODEL_GRAPH_ERROR)


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment



def write_shared_object(path, soname: str, graph_name: str, payload: bytes, page_size: int = 0x1000) -> None:
    """Write lib<graph>.so for aarch64 carrying `payload` (the model's weights) in .rodata."""
    funcs = [b"QnnModel_composeGraphs", b"QnnModel_freeGraphsInfo"]
    objects = [b"qnn_standin_graph_name", b"qnn_standin_payload"]
    # .dynstr
    dynstr = b"\0"
    offsets = {}
    for name in funcs + objects + [soname.encode()]:
        offsets[name] = len(dynstr)
        dynstr += name + b"\0"
    header_size, phnum = 64, 4
    cursor = header_size + phnum * 56
    layout = {}

    def place(name: str, size: int, align: int) -> int:
        nonlocal cursor
        cursor = _align(cursor, align)
        layout[name] = (cursor, size)
        cursor += size
        return layout[name][0]

    nsyms = 1 + len(funcs) + len(objects)
    hash_size = 4 * (2 + 1 + nsyms)            # nbucket=1, nchain=nsyms
    place(".hash", hash_size, 8)
    place(".dynsym", 24 * nsyms, 8)
    place(".dynstr", len(dynstr), 1)
    place(".text", len(STUB) * len(funcs), 4)
    name_bytes = graph_name.encode() + b"\0"
    place(".rodata", 16 + len(name_bytes) + len(payload), 16)
    text_end = cursor
    # second segment: .dynamic, RW, at an address congruent to its file offset modulo the page size
    dynamic_entries = 7
    dyn_offset = _align(cursor, 16)
    dyn_size = 16 * dynamic_entries
    dyn_vaddr = _align(text_end, page_size) + (dyn_offset % page_size)
    layout[".dynamic"] = (dyn_offset, dyn_size)
    cursor = dyn_offset + dyn_size
    shstr_names = [b"", b".hash", b".dynsym", b".dynstr", b".text", b".rodata", b".dynamic", b".shstrtab"]
    shstrtab = b""
    shname = {}
    for n in shstr_names:
        shname[n] = len(shstrtab)
        shstrtab += n + b"\0"
    place(".shstrtab", len(shstrtab), 1)
    shoff = _align(cursor, 8)
    shnum = len(shstr_names)
    total = shoff + 64 * shnum

    buf = bytearray(total)
    # ELF header
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    buf[0:64] = ident + struct.pack("<HHIQQQIHHHHHH", 3, EM_AARCH64, 1, 0, header_size, shoff, 0,
                                    64, 56, phnum, 64, shnum, shnum - 1)
    # program headers
    phdrs = [
        (PT_LOAD, PF_R | PF_X, 0, 0, 0, text_end, text_end, page_size),
        (PT_LOAD, PF_R | PF_W, dyn_offset, dyn_vaddr, dyn_vaddr, dyn_size, dyn_size, page_size),
        (PT_DYNAMIC, PF_R | PF_W, dyn_offset, dyn_vaddr, dyn_vaddr, dyn_size, dyn_size, 8),
        (PT_GNU_STACK, PF_R | PF_W, 0, 0, 0, 0, 0, 16),
    ]
    for i, ph in enumerate(phdrs):
        buf[64 + 56 * i: 64 + 56 * (i + 1)] = struct.pack("<IIQQQQQQ", *ph)
    # .dynstr, .text, .rodata
    off = layout[".dynstr"][0]
    buf[off: off + len(dynstr)] = dynstr
    text_off = layout[".text"][0]
    for i in range(len(funcs)):
        buf[text_off + 8 * i: text_off + 8 * (i + 1)] = STUB
    ro_off = layout[".rodata"][0]
    name_off = ro_off + 16
    payload_off = name_off + len(name_bytes)
    buf[ro_off: ro_off + 16] = struct.pack("<QQ", len(payload), len(name_bytes))
    buf[name_off: name_off + len(name_bytes)] = name_bytes
    buf[payload_off: payload_off + len(payload)] = payload
    # .dynsym: null, functions, objects (addresses = file offsets in the first segment, vaddr 0 based)
    symbols = [struct.pack("<IBBHQQ", 0, 0, 0, 0, 0, 0)]
    for i, name in enumerate(funcs):
        symbols.append(struct.pack("<IBBHQQ", offsets[name], (STB_GLOBAL << 4) | STT_FUNC, 0, 4,
                                   text_off + 8 * i, 8))
    for name, (addr, size) in zip(objects, [(name_off, len(name_bytes)), (payload_off, len(payload))]):
        symbols.append(struct.pack("<IBBHQQ", offsets[name], (STB_GLOBAL << 4) | STT_OBJECT, 0, 5, addr, size))
    sym_off = layout[".dynsym"][0]
    buf[sym_off: sym_off + 24 * nsyms] = b"".join(symbols)
    # .hash: one bucket chaining every symbol
    chain = [0] * nsyms
    for i in range(1, nsyms - 1):
        chain[i] = i + 1
    hash_off = layout[".hash"][0]
    buf[hash_off: hash_off + hash_size] = struct.pack(f"<II I {nsyms}I", 1, nsyms, 1 if nsyms > 1 else 0, *chain)
    # .dynamic
    dyn = [(DT_HASH, layout[".hash"][0]), (DT_STRTAB, layout[".dynstr"][0]), (DT_SYMTAB, sym_off),
           (DT_STRSZ, len(dynstr)), (DT_SYMENT, 24), (DT_SONAME, offsets[soname.encode()]), (DT_NULL, 0)]
    buf[dyn_offset: dyn_offset + dyn_size] = b"".join(struct.pack("<qQ", tag, val) for tag, val in dyn)
    # .shstrtab + section headers
    shs_off = layout[".shstrtab"][0]
    buf[shs_off: shs_off + len(shstrtab)] = shstrtab
    sections = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (shname[b".hash"], SHT_HASH, SHF_ALLOC, hash_off, hash_off, hash_size, 2, 0, 8, 4),
        (shname[b".dynsym"], SHT_DYNSYM, SHF_ALLOC, sym_off, sym_off, 24 * nsyms, 3, 1, 8, 24),
        (shname[b".dynstr"], SHT_STRTAB, SHF_ALLOC, off, off, len(dynstr), 0, 0, 1, 0),
        (shname[b".text"], SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, text_off, text_off, 8 * len(funcs), 0, 0, 4, 0),
        (shname[b".rodata"], SHT_PROGBITS, SHF_ALLOC, ro_off, ro_off, layout[".rodata"][1], 0, 0, 16, 0),
        (shname[b".dynamic"], SHT_DYNAMIC, SHF_ALLOC | SHF_WRITE, dyn_vaddr, dyn_offset, dyn_size, 3, 0, 8, 16),
        (shname[b".shstrtab"], SHT_STRTAB, 0, 0, shs_off, len(shstrtab), 0, 0, 1, 0),
    ]
    for i, (name, kind, flags, addr, offset, size, link, info, align, entsize) in enumerate(sections):
        buf[shoff + 64 * i: shoff + 64 * (i + 1)] = struct.pack("<IIQQQQIIQQ", name, kind, flags, addr, offset, size,
                                                                link, info, align, entsize)
    with open(path, "wb") as fh:
        fh.write(buf)
