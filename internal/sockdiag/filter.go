package sockdiag

import "encoding/binary"

// inet_diag bytecode (linux/inet_diag.h): a filter the kernel runs on every
// socket of a dump before it reports it, so that a dump asking for a few
// ports costs the namespace's sockets a comparison each and reports only
// those.
const (
	attrReqBytecode = 1 // INET_DIAG_REQ_BYTECODE

	bcJmp = 1  // INET_DIAG_BC_JMP: always takes no
	bcSEq = 11 // INET_DIAG_BC_S_EQ: local port equal (4.x)

	bcOpLen = 4 // struct inet_diag_bc_op: code, yes, no (u16)
)

// localPortFilter compiles "the local port is one of ports" to inet_diag
// bytecode, the way ss compiles `sport = :a or sport = :b`: each test is
// S_EQ (its port in the next op's no field), whose yes falls through to a
// JMP over the tests left (accept: the program's end is reached exactly)
// and whose no skips that JMP to the next test; the last test's no jumps
// past the end (reject). The kernel's audit (inet_diag_bc_audit) follows
// the yes edges and checks every no edge lands on one.
func localPortFilter(ports []uint16) []byte {
	if len(ports) == 0 {
		return nil
	}
	// The last test, then each earlier one in front of a JMP over the rest.
	prog := sEq(ports[len(ports)-1])
	for i := len(ports) - 2; i >= 0; i-- {
		rest := len(prog)
		head := sEq(ports[i])
		jmp := op(bcJmp, bcOpLen, uint16(rest+bcOpLen))
		prog = append(append(head, jmp...), prog...)
	}
	return prog
}

// sEq is one port test: yes continues with the next op, no skips it.
func sEq(port uint16) []byte {
	return append(op(bcSEq, 2*bcOpLen, 2*bcOpLen+bcOpLen), op(0, 0, port)...)
}

func op(code, yes uint8, no uint16) []byte {
	b := make([]byte, bcOpLen)
	b[0], b[1] = code, yes
	binary.NativeEndian.PutUint16(b[2:], no)
	return b
}

// putBytecodeAttr appends the INET_DIAG_REQ_BYTECODE attribute holding bc
// to req.
func putBytecodeAttr(req, bc []byte) []byte {
	var hdr [4]byte
	binary.NativeEndian.PutUint16(hdr[0:], uint16(4+len(bc)))
	binary.NativeEndian.PutUint16(hdr[2:], attrReqBytecode)
	return append(append(req, hdr[:]...), bc...)
}
