/* The attention views of attnprobe pages and notebook outputs (inlined; no network).
   Defined once per page under the global name attnprobeViews (several notebook outputs on one
   page share it); every element with a data-maps attribute is mounted once. Its maps are read
   from the JSON element whose id data-maps names; each map's base64 uint8 weights decode as
   weight = byte / 255.
   Head view: the chosen sentence / layer / head as two token columns joined by lines whose
   opacity is the weight. Hovering a query token (left) shows its row; hovering a key token
   (right) shows its column. Tokens at or after a map's prompt_length were generated: italics,
   dotted underline, a tooltip; the sentence menu says how many.
   Model view (.ap-model): every layer x head of the sentence as a small heatmap (one canvas
   each, darker = more weight); clicking one opens that head in the head view and shows its
   panel in .ap-details (the .ap-detail whose data-layer/data-head match, pre-rendered and
   escaped by the page) and its name in .ap-current.
   Text is set with textContent, never parsed as HTML, and bidirectional control characters
   are shown as U+202E the way attnprobe/report/text.py shows them in the rest of the page.
   A token longer than the frame's data-token-chars is shown cut, ending in an ellipsis, and
   whole in its tooltip (as templates/tokens.j2 does), so one huge token cannot widen the
   page. */
(function(){
  "use strict";
  if(!window.attnprobeViews)window.attnprobeViews=(function(){
    var ROW=16,W=220,BIDI=/[\u202A-\u202E\u2066-\u2069]/g;
    function show(t){return String(t).replace(BIDI,function(c){
      return "\u27E8U+"+c.charCodeAt(0).toString(16).toUpperCase()+"\u27E9";});}
    function opt(sel,items){sel.textContent="";items.forEach(function(it){
      var o=document.createElement("option");o.value=it[0];o.textContent=show(it[1]);
      sel.appendChild(o);});}
    function clip(t,n){var c=Array.from(String(t));
      return c.length>n?c.slice(0,n-1).join("")+"\u2026":String(t);}
    function generated(m){return m.prompt_length===null||m.prompt_length===undefined?0:
      m.query_tokens.length-m.prompt_length;}
    function mount(root){
      if(root.getAttribute("data-ap-mounted"))return;
      var el=document.getElementById(root.getAttribute("data-maps"));if(!el)return;
      root.setAttribute("data-ap-mounted","1");
      var maps=JSON.parse(el.textContent),cache={},
          chars=+root.getAttribute("data-token-chars")||32;
      function q(s){return root.querySelector(s);}
      var sSel=q(".sel-sentence"),lSel=q(".sel-layer"),hSel=q(".sel-head"),left=q(".left"),
          right=q(".right"),svg=q("svg.lines"),model=q(".ap-model"),current=q(".ap-current");
      var details=root.querySelectorAll(".ap-detail");
      function bytes(i){
        if(!cache[i]){var s=atob(maps[i].data),a=new Uint8Array(s.length);
          for(var j=0;j<s.length;j++)a[j]=s.charCodeAt(j);cache[i]=a;}
        return cache[i];}
      function isGen(m,i){return generated(m)>0&&i>=m.prompt_length;}
      function detailOf(m,li,hi){var found=null;
        for(var d=0;d<details.length;d++){var e=details[d];
          if(+e.getAttribute("data-layer")!==m.layers[li]||
             +e.getAttribute("data-head")!==m.heads[hi]||
             e.getAttribute("data-kind")!==m.kind)continue;
          if(e.getAttribute("data-stack")===m.stack)return e;if(!found)found=e;}
        return found;}
      function name(m,li,hi){return "L"+m.layers[li]+"H"+m.heads[hi];}
      opt(sSel,maps.map(function(m,i){var g=generated(m);
        return [i,g?m.id+" (+"+g+" generated)":m.id];}));
      if(maps.some(function(m){return generated(m)>0;}))q(".gen-note").hidden=false;
      function fillAxes(){var m=maps[+sSel.value];
        opt(lSel,m.layers.map(function(l,i){return [i,"layer "+l];}));
        opt(hSel,m.heads.map(function(h,i){return [i,"head "+h];}));}
      function weights(){var i=+sSel.value,m=maps[i],Q=m.shape[2],K=m.shape[3];
        var off=((+lSel.value)*m.shape[1]+(+hSel.value))*Q*K;
        return {a:bytes(i),off:off,Q:Q,K:K,m:m};}
      function col(parent,toks,side,m){parent.textContent="";toks.forEach(function(t,i){
        var d=document.createElement("div");d.className="tok";d.textContent=show(clip(t,chars));
        d.dataset.i=i;var tip=clip(t,chars)===String(t)?"":show(t);
        if(isGen(m,i)&&(side==="q"||m.kind==="self")){d.classList.add("gen");
          d.style.fontStyle="italic";d.style.textDecoration="underline dotted";
          tip=tip?tip+" (generated)":"generated";}
        if(tip)d.title=tip;
        d.addEventListener("mouseenter",function(){draw(side,i);});
        d.addEventListener("mouseleave",function(){draw(null,-1);});
        parent.appendChild(d);});}
      function draw(side,idx){var w=weights(),ns=svg.namespaceURI;
        svg.textContent="";svg.setAttribute("height",Math.max(w.Q,w.K)*ROW);
        var lt=left.children,rt=right.children,qi,k,v;
        for(qi=0;qi<lt.length;qi++)lt[qi].style.background="";
        for(k=0;k<rt.length;k++)rt[k].style.background="";
        for(qi=0;qi<w.Q;qi++){if(side==="q"&&qi!==idx)continue;
          for(k=0;k<w.K;k++){if(side==="k"&&k!==idx)continue;
            v=w.a[w.off+qi*w.K+k]/255;
            if(side==="q")rt[k].style.background="rgba(230,85,13,"+v+")";
            if(side==="k")lt[qi].style.background="rgba(230,85,13,"+v+")";
            if(v<0.01)continue;
            var ln=document.createElementNS(ns,"line");
            ln.setAttribute("x1",0);ln.setAttribute("y1",qi*ROW+ROW/2);
            ln.setAttribute("x2",W);ln.setAttribute("y2",k*ROW+ROW/2);
            ln.setAttribute("stroke","#e6550d");ln.setAttribute("stroke-width",2);
            ln.setAttribute("stroke-opacity",side?v:v*0.6);
            var t=document.createElementNS(ns,"title");
            t.textContent=show(w.m.query_tokens[qi])+" \u2192 "+show(w.m.key_tokens[k])+": "+
              v.toFixed(3);
            ln.appendChild(t);svg.appendChild(ln);}}
        if(side==="q")lt[idx].style.background="#ddd";
        if(side==="k")rt[idx].style.background="#ddd";}
      function select(){var m=maps[+sSel.value],li=+lSel.value,hi=+hSel.value,
          shown=detailOf(m,li,hi),d;
        for(d=0;d<details.length;d++)details[d].hidden=details[d]!==shown;
        if(current)current.textContent="layer "+m.layers[li]+", head "+m.heads[hi]+
          " ("+name(m,li,hi)+")"+(shown||!details.length?"":": no census for this head");
        if(!model)return;var th=model.querySelectorAll("canvas");
        for(d=0;d<th.length;d++)th[d].classList.toggle("on",
          +th[d].getAttribute("data-l")===li&&+th[d].getAttribute("data-h")===hi);}
      function thumb(m,a,li,hi){var Q=m.shape[2],K=m.shape[3],c=document.createElement("canvas");
        c.width=K;c.height=Q;c.setAttribute("data-l",li);c.setAttribute("data-h",hi);
        var d=detailOf(m,li,hi);
        c.title=name(m,li,hi)+(d?": "+show(d.getAttribute("data-label")):"");
        var ctx=c.getContext("2d"),img=ctx.createImageData(K,Q),off=(li*m.shape[1]+hi)*Q*K;
        for(var p=0;p<Q*K;p++){var s=Math.round(255*Math.sqrt(a[off+p]/255));
          img.data[4*p]=230;img.data[4*p+1]=85;img.data[4*p+2]=13;img.data[4*p+3]=s;}
        ctx.putImageData(img,0,0);
        c.addEventListener("click",function(){lSel.value=li;hSel.value=hi;render();});
        return c;}
      function thumbs(){if(!model)return;var i=+sSel.value,m=maps[i],a=bytes(i);
        model.textContent="";var head=document.createElement("div");head.className="row";
        head.appendChild(document.createElement("span"));
        m.heads.forEach(function(h){var s=document.createElement("span");s.textContent="H"+h;
          head.appendChild(s);});model.appendChild(head);
        m.layers.forEach(function(l,li){var row=document.createElement("div");row.className="row";
          var s=document.createElement("span");s.textContent="L"+l;row.appendChild(s);
          m.heads.forEach(function(h,hi){row.appendChild(thumb(m,a,li,hi));});
          model.appendChild(row);});}
      function render(){var m=maps[+sSel.value];col(left,m.query_tokens,"q",m);
        col(right,m.key_tokens,"k",m);svg.setAttribute("width",W);draw(null,-1);select();}
      sSel.addEventListener("change",function(){fillAxes();thumbs();render();});
      lSel.addEventListener("change",render);hSel.addEventListener("change",render);
      fillAxes();thumbs();render();}
    function mountAll(){var roots=document.querySelectorAll("[data-maps]");
      for(var i=0;i<roots.length;i++)mount(roots[i]);}
    return {mount:mount,mountAll:mountAll};
  })();
  window.attnprobeViews.mountAll();
})();
