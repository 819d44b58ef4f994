#!/usr/bin/env python3
# Lists the functions of src/, probes/ and tools/ longer than N lines (default 120: the limit
# docs/architecture.md sets), longest first: "LINES FILE START_LINE". A brace matcher over the text
# with comments and string literals blanked, not a parser: a function is a brace block opened at
# namespace or class level after a parenthesised head; its lambdas count within it.
#   python3 scripts/function_lengths.py [N]      (run from the repository root; exit 1 when any is listed)
import glob
import re
import sys

LIM=int(sys.argv[1]) if len(sys.argv)>1 else 120
res=[]
for f in sorted(glob.glob('src/**/*.cpp',recursive=True)+glob.glob('src/**/*.h',recursive=True)+glob.glob('probes/**/*.[ch]*',recursive=True)+glob.glob('tools/*.[ch]*')):
    txt=open(f).read()
    txt=re.sub(r'//[^\n]*','',txt); txt=re.sub(r'"(\\.|[^"\\\n])*"','""',txt); txt=re.sub(r"'(\\.|[^'\\\n])'","''",txt)
    stack=[]  # entries: kind
    line=1; stmt_start=0; last=0
    i=0
    for i,c in enumerate(txt):
        if c=='\n': line+=1
        if c=='{':
            head=txt[last:i]
            h=head.strip()
            kinds=[k for k,_ in stack]
            if re.search(r'\b(namespace)\b',h) and ('(' not in h): kind='ns'
            elif re.search(r'\b(struct|class|enum|union)\b',h) and '(' not in h: kind='cls'
            elif all(k in('ns','cls') for k in kinds) and '(' in h and not re.match(r'^(if|for|while|switch|else|do|return)\b',h.split('\n')[-1].strip()):
                kind='fn'
            else: kind='blk'
            stack.append((kind,line)); last=i+1
        elif c=='}':
            if stack:
                k,l0=stack.pop()
                if k=='fn' and line-l0+1>LIM: res.append((line-l0+1,f,l0))
            last=i+1
        elif c==';': last=i+1
for r in sorted(res,reverse=True): print(*r)
sys.exit(1 if res else 0)
