"""The trace CSV the synthetic generators write (gen_streams_trace.py, gen_offload_trace.py,
gen_varlen_trace.py):
action,addr,size,stream,time_us, one event per line, each at the next microsecond; stream 0 of the
generator is stream 1 of the trace."""


class TraceWriter:
    """Allocations at distinct, page-aligned addresses (a 4 KiB gap between any two), so a replay
    never sees an address reused. alloc returns the block (addr, size, stream) that free takes."""

    def __init__(self, out):
        self.out = out
        self.addr = 1 << 40
        self.t = 0
        out.write("action,addr,size,stream,time_us\n")

    def alloc(self, size, s):
        addr = self.addr
        self.addr += (size + 4095) // 4096 * 4096 + 4096
        self.t += 1
        self.out.write(f"alloc,{addr},{size},{s + 1},{self.t}\n")
        return addr, size, s

    def free(self, b):
        self.t += 1
        self.out.write(f"free_completed,{b[0]},{b[1]},{b[2] + 1},{self.t}\n")
